"""GPU utilisation and memory per rank, through NVML (``pynvml``, package nvidia-ml-py).

Optional: without the package, a driver or a GPU the agent reports no GPUs and
says why once. A rank hung in NCCL spins at 100% CPU in cudaStreamSynchronize;
its GPU at 0% utilisation is what tells the hang from work.

Which GPUs a rank uses: NVML's per-process list (nvmlDeviceGetComputeRunningProcesses)
when it names the rank's pid; else its CUDA_VISIBLE_DEVICES (indices or UUIDs)
and LOCAL_RANK, the usual one-device-per-local-rank layout. (In a container the
per-process list holds host pids, hence the fallback.)

The NVML module is a constructor parameter, so the tests drive a fake one.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl")

MAX_GPUS_PER_RANK = 16
NVML_CLOCK_SM = 1
# nvmlClocksEventReason* bits (nvml.h), by the names the monitor reads (monitor/diagnosis/gpu_clocks.py).
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def clock_event_reasons(mask: int) -> list[str]:
    """NVML's reasons for holding the clocks down, by name, from its bit mask."""
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


def load_nvml():
    """The pynvml module, initialised; raises with the reason when unavailable."""
    import pynvml  # noqa: PLC0415 -- optional dependency

    pynvml.nvmlInit()
    return pynvml


def parse_visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of entries (indices or UUIDs); None when unset.

    CUDA stops at the first invalid entry; "-1" or "" hides every device.
    """
    if value is None:
        return None
    out = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        out.append(item)
    return out


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class GpuCollector:
    def __init__(self, nvml=None, loader=load_nvml, driver_paths=NVIDIA_DRIVER_PATHS):
        """``nvml``: an initialised NVML module (tests pass a fake); else ``loader()`` is tried once."""
        self.nvml = nvml
        self.driver_present = any(os.path.exists(p) for p in driver_paths)
        self.unavailable: str | None = None
        if nvml is None:
            try:
                self.nvml = loader()
            except Exception as e:  # noqa: BLE001 -- ImportError, NVMLError_LibraryNotFound, ...
                self.unavailable = f"NVML unavailable: {type(e).__name__}: {e}"[:2048]
                log.info("no GPU metrics: %s", self.unavailable)
        self._handles: dict[str, object] = {}  # "0" or a UUID -> device handle
        self._index_of: dict[int, int] = {}  # id(handle) -> NVML index
        self._names: dict[int, str] = {}

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def health(self) -> dict | None:
        """Why there are no GPU metrics (logged once; NVML is not retried).

        A failure only where an NVIDIA driver is present: there the metrics are missing
        for a reason someone can fix (install nvidia-ml-py); on a CPU node it is fine.
        """
        if self.available:
            return None
        return {"name": "gpus", "ok": not self.driver_present, "error": self.unavailable, "duration_s": None}

    def _handle(self, key: str):
        handle = self._handles.get(key)
        if handle is None:
            n = self.nvml
            if key.isdigit():
                handle = n.nvmlDeviceGetHandleByIndex(int(key))
            else:
                handle = n.nvmlDeviceGetHandleByUUID(key)
            self._handles[key] = handle
            self._index_of[id(handle)] = int(key) if key.isdigit() else n.nvmlDeviceGetIndex(handle)
            try:
                self._names[id(handle)] = _text(n.nvmlDeviceGetName(handle))[:256]
            except Exception:  # noqa: BLE001 -- a name is a nicety
                self._names[id(handle)] = ""
        return handle

    def collect(self, ranks) -> dict[int, list[dict]]:
        """pid -> GpuReport dicts for every rank (RankProcess with .pid, .env, .identity)."""
        if not self.available or not ranks:
            return {}
        n = self.nvml
        count = n.nvmlDeviceGetCount()
        # One query per device per sweep, however many ranks share it.
        procs: dict[int, dict[int, int | None]] = {}  # index -> {pid: used bytes}
        util: dict[int, float | None] = {}
        memory: dict[int, int | None] = {}
        clocks: dict[int, dict] = {}
        for index in range(count):
            handle = self._handle(str(index))
            try:
                running = n.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:  # noqa: BLE001 -- not supported on some devices/drivers
                running = []
            procs[index] = {p.pid: getattr(p, "usedGpuMemory", None) for p in running}

        def device(index: int) -> tuple[float | None, int | None]:
            if index not in util:
                handle = self._handle(str(index))
                try:
                    util[index] = float(n.nvmlDeviceGetUtilizationRates(handle).gpu)
                except Exception:  # noqa: BLE001
                    util[index] = None
                try:
                    memory[index] = int(n.nvmlDeviceGetMemoryInfo(handle).used)
                except Exception:  # noqa: BLE001
                    memory[index] = None
                clocks[index] = self._clocks(handle)
            return util[index], memory[index]

        out = {}
        for proc in ranks:
            indices = [i for i in range(count) if proc.pid in procs[i]]
            from_process_list = bool(indices)
            if not indices:
                indices = self._indices_from_env(proc, count)
            gpus = []
            for index in indices[:MAX_GPUS_PER_RANK]:
                utilization, used = device(index)
                if from_process_list and procs[index].get(proc.pid) is not None:
                    used = int(procs[index][proc.pid])  # this process's own memory
                gpus.append({
                    "index": index,
                    "utilization_percent": utilization,
                    "memory_used_bytes": used,
                    "name": self._names.get(id(self._handle(str(index))), ""),
                    **clocks[index],
                })
            out[proc.pid] = gpus
        return out

    def _clocks(self, handle) -> dict:
        """The SM clock, its maximum and why it is held down (a GPU slower than its peers says why)."""
        n = self.nvml
        out: dict = {"sm_clock_mhz": None, "max_sm_clock_mhz": None, "clock_event_reasons": []}
        for key, call in (("sm_clock_mhz", "nvmlDeviceGetClockInfo"), ("max_sm_clock_mhz", "nvmlDeviceGetMaxClockInfo")):
            try:
                out[key] = int(getattr(n, call)(handle, NVML_CLOCK_SM))
            except Exception:  # noqa: BLE001 -- not supported on some devices (MIG, vGPU)
                pass
        # Renamed in NVML 12.2 ("throttle" became "clocks event"); older bindings have only the old name.
        for call in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            reasons = getattr(n, call, None)
            if reasons is None:
                continue
            try:
                out["clock_event_reasons"] = clock_event_reasons(int(reasons(handle)))
            except Exception:  # noqa: BLE001
                pass
            break
        return out

    def _indices_from_env(self, proc, count: int) -> list[int]:
        visible = parse_visible_devices(proc.env.get("CUDA_VISIBLE_DEVICES"))
        entries = visible if visible is not None else [str(i) for i in range(count)]
        local = proc.identity.local_rank
        if len(entries) == 1:
            chosen = entries
        elif local is not None and 0 <= local < len(entries):
            chosen = [entries[local]]
        else:
            return []  # which of several devices it uses is unknown
        out = []
        for entry in chosen:
            try:
                handle = self._handle(entry)
            except Exception:  # noqa: BLE001 -- an entry NVML does not know (MIG, typo)
                continue
            index = self._index_of.get(id(handle))
            if index is not None and index < count:
                out.append(index)
        return out
