-- expired: ARGV limit, most entries examined, then the namespaces (none: every one).
-- Records someone must act on, oldest `lease` first: running runs whose lease passed and
-- waiting retries whose not-before passed (both in the expiry set, scored by `lease`), of
-- jobs in those namespaces only. Returns {1 if the scan stopped at its bound with due
-- entries left unexamined else 0, records}.
handlers.expired = function(KEYS, ARGV)
  local namespaces = namespaces_from(ARGV, 4)
  -- The job is the last part of the id: no record is read to filter.
  local ids, bounded = scan(EXPIRY, '(' .. NOW_S, tonumber(ARGV[2]), tonumber(ARGV[3]), function(id)
    return serves(namespaces, (split_id(id)))
  end)
  return {bounded and 1 or 0, hashes(ids, run_key)}
end
