-- cursor.lua: where a page of a sorted set goes on: just past the last member shown, found by
-- its score and its member (or the member's first bytes, its mark), not by an index that the
-- members leaving or coming before it (delayed jobs promoted, jobs whose records moved) shift.

-- -1, 0 or 1 as a sorts before, with or after b byte by byte, as Redis orders the members of
-- one score (memcmp, then the shorter first). Not Lua's <: that compares by the locale's
-- collation, and Redis sets LC_COLLATE from its environment.
local function bytes_order(a, b)
  if a == b then return 0 end
  local n = math.min(#a, #b)
  for i = 1, n, 64 do
    local j = math.min(i + 63, n)
    if string.sub(a, i, j) ~= string.sub(b, i, j) then
      for k = i, j do
        local x, y = string.byte(a, k), string.byte(b, k)
        if x ~= y then return x < y and -1 or 1 end
      end
    end
  end
  return #a < #b and -1 or 1
end

-- Whether ``member`` comes after the cursor's (``mark``: its first bytes, all of it when
-- ``whole``) in the page's order (``rev``: descending). Among members of one score, one that
-- starts with a mark that is not the whole member may be the member itself or another one
-- sharing those bytes: it counts as shown (jobd's members differ in their first bytes: a
-- delayed member's unique id, a job id of at most the mark's length).
local function past_mark(member, mark, whole, rev)
  local order = bytes_order(string.sub(member, 1, #mark), mark)
  if rev then return order < 0 end
  return order > 0 or (order == 0 and whole and #member > #mark)
end

-- The index (in ``rev``'s order) of the first member of ``key`` past the cursor (``score`` as
-- Redis writes one, ``mark``, ``whole``), and the bytes of members read to find it: the
-- members of a lower score (a higher one, ``rev``) come first, then those of the cursor's
-- score, ordered by member, are searched by halves: log2 of their number read at most, one
-- member at a time.
local function resume(key, score, mark, whole, rev)
  local lo
  if rev then
    lo = redis.call('ZCOUNT', key, '(' .. score, '+inf')
  else
    lo = redis.call('ZCOUNT', key, '-inf', '(' .. score)
  end
  local hi, read = lo + redis.call('ZCOUNT', key, score, score), 0
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local found
    if rev then
      found = redis.call('ZRANGE', key, mid, mid, 'REV')
    else
      found = redis.call('ZRANGE', key, mid, mid)
    end
    read = read + #found[1]
    if past_mark(found[1], mark, whole, rev) then hi = mid else lo = mid + 1 end
  end
  return lo, read
end
