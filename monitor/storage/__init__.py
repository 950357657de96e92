"""What outlives the process: the SQLite store of snapshots and verdict history, and captured evidence."""
