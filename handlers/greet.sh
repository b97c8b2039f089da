#!/bin/sh
# A jobd handler in sh: the payload is a name on stdin.
# Exit 0: done. Exit 65 (EX_DATAERR): bad input, dead-letter it. Exit 75 (EX_TEMPFAIL): retry later.
set -eu
state="${EXAMPLE_STATE:-/tmp/jobd-example}/greetings"
if ! mkdir -p "$state" 2>/dev/null; then
  echo "cannot create $state; try again later" >&2
  exit 75
fi

# JOBD_JOB_ID is stable across retries and redeliveries: use it to do the work once.
if [ -e "$state/$JOBD_JOB_ID" ]; then
  echo "job $JOBD_JOB_ID was already done; nothing to do"
  exit 0
fi

name=$(cat)
if [ -z "$name" ]; then
  echo "empty payload: expected a name" >&2
  exit 65
fi

echo "Hello, $name! (attempt $JOBD_ATTEMPT)"
printf '%s\n' "$name" > "$state/$JOBD_JOB_ID.tmp" && mv "$state/$JOBD_JOB_ID.tmp" "$state/$JOBD_JOB_ID"
