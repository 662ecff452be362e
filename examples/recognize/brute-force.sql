-- Three failed logins in a row (the demo job's login-brute-force pattern), then a successful one, within five minutes (per account).
SELECT * FROM transactions MATCH_RECOGNIZE (
  PARTITION BY account
  ORDER BY event_time
  MEASURES FIRST(F.event_time) AS first_failure, S.event_time AS login_time,
           COUNT(F.id) AS failures, S.country AS login_country
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (F{3} S) WITHIN INTERVAL '5' MINUTE
  DEFINE F AS F.type = 'login_failed',
         S AS S.type = 'login_ok'
)
