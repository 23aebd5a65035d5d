"""The supervisor: finds orders whose complete-by time has passed and requests recovery.

It only requests recovery (a reset and a nudge, or Error and an alert); the scheduler
and the agents do the work. Every action is If-Match guarded, so overlapping
supervisors act once per row.
"""
