// Recording rules: what the dashboard (and ad-hoc queries) read, computed once per evaluation.
local lib = import 'lib.libsonnet';

{
  prometheusRules+:: {
    local h = lib.new($._config),

    groups+: [
      {
        name: 'hangwatch-recording',
        rules: [
          {
            // The job's verdict as one number (the dashboard maps it back to words): exactly one
            // verdict series of a job is 1, so `or` keeps one term per job.
            record: 'job_id:hangwatch_job_verdict:code',
            expr: 'max by (%s) (\n  %s\n)' % [h.by(['job_id']), std.join('\n  or ', [
              '(hangwatch_job_verdict%s == 1) * %d' % [h.sel(['verdict="%s"' % v.verdict]), i]
              for i in std.range(0, std.length(h.verdicts) - 1)
              for v in [h.verdicts[i]]
            ])],
          },
          {
            record: 'job_id:hangwatch_seconds_since_progress:min',
            expr: 'time() - max by (%s) (hangwatch_job_last_progress_timestamp_seconds%s)' % [h.by(['job_id']), h.sel()],
          },
          {
            record: 'job_id_rank:hangwatch_seconds_since_progress:min',
            expr: 'time() - max by (%s) (hangwatch_rank_last_progress_timestamp_seconds%s)'
                  % [h.by(['job_id', 'rank']), h.sel()],
          },
          {
            record: 'node:hangwatch_agent_seconds_since_report:min',
            expr: 'time() - max by (%s) (hangwatch_agent_last_report_timestamp_seconds%s)' % [h.by(['node']), h.sel()],
          },
        ],
      },
    ],
  },
}
