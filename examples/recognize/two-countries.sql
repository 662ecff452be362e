-- A purchase, a purchase in another country, then (any rows later) a large purchase, within
-- ten minutes. MATCH_RECOGNIZE rows are contiguous: the reluctant X*? absorbs what lies between.
SELECT * FROM transactions MATCH_RECOGNIZE (
  PARTITION BY account
  ORDER BY event_time
  MEASURES HOME.country AS home, ABROAD.country AS abroad, LARGE.amount AS amount,
           LARGE.event_time AS large_at
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (HOME ABROAD X*? LARGE) WITHIN INTERVAL '10' MINUTE
  DEFINE HOME AS HOME.type = 'purchase',
         ABROAD AS ABROAD.type = 'purchase' AND ABROAD.country <> HOME.country,
         LARGE AS LARGE.type = 'purchase' AND LARGE.amount > 1000
)
