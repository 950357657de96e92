"""The job passes: live records to immutable views, the rules, settling, incidents, cost, timeline and actions;
publishes one immutable result per job."""
