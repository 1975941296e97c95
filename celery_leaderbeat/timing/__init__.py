"""Time: the cron engine, clocks, slots, schedules and the catch-up policy."""
