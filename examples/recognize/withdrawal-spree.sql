-- Beyond Flink: ALL ROWS PER MATCH. Withdrawals growing in amount, each row of the run with its
-- place in it (RUNNING) and the run's total (FINAL).
SELECT * FROM transactions MATCH_RECOGNIZE (
  PARTITION BY account
  ORDER BY event_time
  MEASURES CLASSIFIER() AS step, MATCH_NUMBER() AS spree, RUNNING COUNT(*) AS so_far,
           FINAL SUM(W.amount) AS total
  ALL ROWS PER MATCH
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (W{3,}? STOP)
  DEFINE W AS W.type = 'withdrawal' AND (LAST(W.amount, 1) IS NULL OR W.amount > LAST(W.amount, 1)),
         STOP AS STOP.type <> 'withdrawal' OR STOP.amount <= LAST(W.amount)
)
