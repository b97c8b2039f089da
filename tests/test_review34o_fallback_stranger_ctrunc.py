"""Review 34o of issue 34: the channel's Python reader (``receive.Receiver._receive_py``, used
where the C extension is not built) returns a stranger by uid (5b8ca06: a sender of a user no
handler runs as, ``Receiver.uids``) before it takes MSG_CTRUNC out of the flags of a message
read without room (``room`` < FDS_MAX, while descriptors wait for the disposer). Read without
room, every message has MSG_CTRUNC (the pidfd SO_PASSPIDFD adds is cut), which says nothing and
is left out — by the C reader for every message (it sets the flags before its stranger test),
by the fallback only for the messages it looks up. So from the fallback each such stranger's
message comes with MSG_CTRUNC, and ``Channel.take_one`` counts it as a message whose
descriptors the kernel dropped: ``jobd_notify_dropped_total{reason="descriptors"}`` one more
for a message that brought none (on top of its ``stranger``), ``laden`` (no rest after the
wake: the flood costs more wakes) and a flush of the batch at each. The two readers are meant
to say the same of every message (tests/test_receive.py).

Reproduced with a real socket (SO_PASSCRED, SO_PASSPIDFD), the reader's users another than
this process's (root sends: a stranger by its uid), one message read with ``room=0`` by each
reader (test_receive's ``receiver`` fixture): the C one gives no MSG_CTRUNC, the fallback does.

Fixed (jobd/daemon/receive.py): the fallback clears MSG_CTRUNC of a message read without room
as soon as it is read, before its stranger return, as the C reader does for every message."""

from __future__ import annotations

import os
import socket

import pytest
from test_receive import receiver  # noqa: F401  (a fixture: the C reader and the fallback)

from jobd.daemon import receive

pytestmark = pytest.mark.skipif(os.getuid() == 65534, reason="the sender must be a stranger")


def test_a_stranger_by_uid_read_without_room_has_no_ctrunc(receiver) -> None:  # noqa: F811
    r, name = receiver
    r.uids = receive.speakers({65534})  # the handlers run as nobody: this process is a stranger
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"STATUS=not a handler's", name)
    ((pid, sid, _, alive, flags, data, fds, *_),) = r.batch([os.getsid(0)], room=0)
    assert (pid, sid, alive, data, fds) == (os.getpid(), -1, False, b"STATUS=not a handler's", ())
    # read without room, every message has MSG_CTRUNC (its pidfd cut): it says nothing, left out
    assert not flags & socket.MSG_CTRUNC, f"flags {flags:#x}: read as descriptors dropped"
