/* jobd.daemon._receive: read the handlers' channel a batch at a time, without the GIL.
 *
 * The channel's thread (``jobd.daemon.channel``) reads one datagram, asks whose it is and
 * parses it; done in Python, every system call of it (recvmsg, getsid, a read of
 * /proc/PID/cgroup, pidfd_send_signal, close) lets go of the GIL and takes it back, and under a
 * flood the thread and the loop hand the GIL to each other thousands of times a second: each
 * hand-over may wait out the interpreter's switch interval, and the loop, whose work is to
 * start handlers, loses a quarter of its throughput to a flood of 10 000 messages a second
 * (``bench/notify_flood.py``). Here a whole batch of messages is read, and what the kernel says
 * of each sender looked up, with the GIL released once: the thread takes the GIL once a batch.
 *
 * ``receive(fd, arena, most, sids, cgroups, room)`` reads until the socket is empty, ``most``
 * messages were read (BATCH_MAX at most), or the writable buffer ``arena`` (the messages one
 * after the other) has no room left for one of MESSAGE_MAX bytes. For each message, in this
 * order (``receive.py`` says why): the sender's pid (SCM_CREDENTIALS) and its session
 * (getsid); its cgroup v2 path (the ``0::`` line of /proc/PID/cgroup) when ``cgroups`` is true
 * and the session is not among ``sids`` (native int32s, sorted: the running handlers'
 * leaders); then whether the sender is still alive, by the pidfd the kernel sent with the
 * message (SCM_PIDFD, Linux 6.5; closed here): a sender gone by then may have left its pid to
 * another process before it was looked up. Returns a list of (pid, sid, cgroup or None, alive,
 * flags, data, fds, said): ``data`` the message (cut at MESSAGE_MAX: ``flags`` then has MSG_TRUNC),
 * ``fds`` the descriptors that came with it, for the caller to dispose of (none is touched
 * here). ``room``: how many descriptors may be taken in all; a message's are taken only while
 * FDS_MAX more fit, else the kernel drops them (MSG_CTRUNC in ``flags``). ``alive`` is None
 * when no pidfd came (a kernel before 6.5, or a message whose descriptors found no room: the
 * kernel puts the pidfd after them), False when the kernel sent its error instead of one (the
 * sender reaped already). An empty list: the socket was empty. Not
 * reentrant on one arena: only the channel's thread calls it with its own.
 *
 * ``spares`` (a writable buffer of ints: descriptors of /dev/null, -1 where none) are given up
 * for the read and taken again after it, as far as slots are free: the kernel installs a
 * message's descriptors before it makes the sender's pidfd, and a daemon at its open-file limit
 * would get the pidfd's error (which says nothing of the sender: not alive). A message is read
 * only while NEED slots are free (a descriptor, the sender's pidfd, its session leader's), the
 * first of a call whatever; after one that took some, the slots free are counted again by
 * taking them (``probe``). ``keep``: for a live sender of a session not among ``sids``, a pidfd
 * of that session's leader is taken, while the sender is in it (``leader_of``), and returned
 * last in its item (the caller's to close; NO_LEADER: there was none; -1 otherwise): a run's
 * one, its first's.
 *
 * ``uids`` (native unsigned ints, sorted; empty: none): the users handlers run as. A message
 * whose sender's uid (SCM_CREDENTIALS: the kernel's word, a process names another only with
 * CAP_SETUID) is none of them is a stranger's, known with no system call more: its sender's
 * pidfd closed, nothing looked up (sid -1, alive False, no cgroup, no leader); a run of them,
 * whoever sent each, is one item. A flood of another user's costs a read and a close a message.
 *
 * Each item ends with what its message says, parsed here as ``process.channel.parse`` does
 * (``parse(data)`` is that alone, for the tests that hold the two to the same answers): a
 * tuple of ``Said``'s fields, or None for a message cut (MSG_TRUNC: not parsed). A run of
 * messages one after the other from the same sender (pid, session, cgroup, alive) that brought
 * no descriptor and were neither cut nor stripped of their ancillary data is one item, their
 * ``Said``s merged as ``Said.merge`` does (``count`` says how many): under a flood from one
 * handler, the thread's Python then takes one item a batch, not 64, with the GIL held.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SCM_PIDFD
#define SCM_PIDFD 0x04
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same on every architecture */
#endif
#define MESSAGE_MAX 65536 /* channel.MESSAGE_MAX */
#define FDS_MAX 253       /* the kernel's SCM_MAX_FD */
#define BATCH_MAX 64      /* messages a call at most */
#define CGROUP_MAX 4096   /* bytes of a cgroup path kept (a longer one is cut: no handler's) */
#define NO_LEADER -2 /* receive.NO_LEADER: an unknown session whose leader was gone */
#define NEED 3 /* free slots a message needs: a descriptor (jobd notify's), two pidfds */

struct message {
    int pid, sid, alive, flags, nfds, cgroup_len; /* cgroup_len -1: not read */
    int stranger; /* its sender's uid is no handler's (``uids``): nothing looked up */
    int leader; /* a pidfd of its session's leader (``keep``), or NO_LEADER, or -1: none */
    size_t offset, size;
    int fds[FDS_MAX];
    char cgroup[CGROUP_MAX];
};


static int compare(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int compare_uids(const void *a, const void *b) {
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    return (x > y) - (x < y);
}

/* The ``0::`` line of /proc/PID/cgroup, without its newline, into m->cgroup; -1 when none.
 * The whole file is read (as the Python reader reads it): on a hybrid host, v1 lines with
 * long paths come before it. */
#define PROC_CGROUP_MAX (1 << 20) /* bytes of /proc/PID/cgroup read at most */
static void read_cgroup(struct message *m) {
    char path[64], *text = NULL;
    size_t size = 0, room = 0;
    m->cgroup_len = -1;
    snprintf(path, sizeof path, "/proc/%d/cgroup", m->pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    for (;;) {
        if (size + 4096 + 1 > room) {
            char *more = room < PROC_CGROUP_MAX ? realloc(text, room ? room * 2 : 8192) : NULL;
            if (more == NULL)
                break;
            text = more;
            room = room ? room * 2 : 8192;
        }
        ssize_t got = read(fd, text + size, room - size - 1);
        if (got <= 0)
            break;
        size += (size_t)got;
    }
    close(fd);
    if (text == NULL)
        return;
    text[size] = '\0';
    for (char *line = text, *next; line < text + size; line = next + 1) {
        next = memchr(line, '\n', (size_t)(text + size - line));
        if (next == NULL)
            next = text + size;
        size_t len = (size_t)(next - line);
        if (len >= 3 && memcmp(line, "0::", 3) == 0) {
            if (len - 3 <= CGROUP_MAX) {
                memcpy(m->cgroup, line + 3, len - 3);
                m->cgroup_len = (int)(len - 3);
            }
            break;
        }
    }
    free(text);
}

/* A pidfd of the leader of m's session (its id looked up: m->sid), taken while m's sender is
 * in it (looked up again after; the sender's pidfd, asked after this, says it was the sender
 * all along): the session then had that leader from before the message was read, and while
 * the leader lives no other session has its id. NO_LEADER: it had none (a handler that gets
 * that pid later is not of that session). */
static int leader_of(const struct message *m) {
    int leader = (int)syscall(SYS_pidfd_open, m->sid, 0); /* close-on-exec, as every pidfd */
    if (leader >= 0 && getsid(m->pid) != m->sid) {        /* it left the session meanwhile */
        close(leader);
        return NO_LEADER;
    }
    return leader >= 0 ? leader : NO_LEADER;
}

/* One message into m (its data at arena + offset): 1 read, 0 none (empty), -1 an error. */
static int read_one(int fd, char *arena, size_t offset, struct message *m, const int *sids,
                    size_t nsids, const unsigned *uids, size_t nuids, int cgroups, int room,
                    int keep) {
    union { /* aligned as the kernel's headers are */
        struct cmsghdr header;
        char bytes[CMSG_SPACE(3 * sizeof(int)) + CMSG_SPACE(sizeof(int)) +
                   CMSG_SPACE(FDS_MAX * sizeof(int))];
    } control;
    struct iovec iov = {arena + offset, MESSAGE_MAX};
    struct msghdr header = {0};
    header.msg_iov = &iov;
    header.msg_iovlen = 1;
    header.msg_control = control.bytes;
    /* without room, the sender's credentials alone: the kernel drops the descriptors, and the
     * pidfd, which it puts after them and which needs as much room as one (MSG_CTRUNC) */
    header.msg_controllen = room ? sizeof control.bytes : CMSG_SPACE(3 * sizeof(int));
    ssize_t got = recvmsg(fd, &header, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    int pidfd = -1, pidfd_came = 0, credentials = 0;
    unsigned uid = 0;
    m->pid = 0;
    m->nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&header); c; c = CMSG_NXTHDR(&header, c)) {
        if (c->cmsg_level != SOL_SOCKET)
            continue;
        size_t len = c->cmsg_len - CMSG_LEN(0);
        if (c->cmsg_type == SCM_CREDENTIALS && len >= 3 * sizeof(int)) {
            memcpy(&m->pid, CMSG_DATA(c), sizeof(int));
            memcpy(&uid, CMSG_DATA(c) + sizeof(int), sizeof(int)); /* struct ucred's uid */
            credentials = 1;
        } else if (c->cmsg_type == SCM_PIDFD && len >= sizeof(int)) {
            memcpy(&pidfd, CMSG_DATA(c), sizeof(int));
            pidfd_came = 1;
        } else if (c->cmsg_type == SCM_RIGHTS) {
            int count = (int)(len / sizeof(int));
            if (count > FDS_MAX - m->nfds)
                count = FDS_MAX - m->nfds;
            memcpy(m->fds + m->nfds, CMSG_DATA(c), count * sizeof(int));
            m->nfds += count;
        }
    }
    m->flags = room ? header.msg_flags : header.msg_flags & ~MSG_CTRUNC;
    m->offset = offset;
    m->size = (size_t)got < MESSAGE_MAX ? (size_t)got : MESSAGE_MAX;
    m->cgroup_len = -1;
    m->leader = -1;
    /* a user no handler runs as (the kernel's word: a process names another uid only with
     * CAP_SETUID): a stranger's, with no system call more (its pidfd closed) */
    m->stranger = nuids > 0 && (!credentials || !bsearch(&uid, uids, nuids, sizeof(unsigned),
                                                         compare_uids));
    if (m->stranger) {
        m->sid = -1;
        m->alive = 0;
        if (pidfd >= 0)
            close(pidfd);
        return 1;
    }
    m->sid = m->pid > 0 ? getsid(m->pid) : -1;
    int known = m->sid >= 0 && bsearch(&m->sid, sids, nsids, sizeof(int), compare) != NULL;
    if (cgroups && m->pid > 0 && !known)
        read_cgroup(m);
    if (keep && pidfd >= 0 && m->sid > 0 && !known)
        m->leader = leader_of(m);
    /* no pidfd came: unknown (an older kernel, or no room: ``room``); a negative one is the
     * kernel's error making it (the sender reaped already): not alive */
    m->alive = pidfd_came ? 0 : -1; /* its error (EMFILE too: since 6.16 a reaped sender gets a
                                        * pidfd, so it says nothing of the sender): not alive */
    if (pidfd >= 0) {
        m->alive = 1;  /* after the lookups: alive now, the pid was the sender's all along */
        if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) < 0 && errno != EPERM)
            m->alive = 0;
        close(pidfd);
    }
    if (m->alive != 1 && m->leader >= 0) {
        close(m->leader);
        m->leader = -1;
    }
    return 1;
}

/* What a message says (``process.channel.Said``), its bytes pointing into the arena. */
struct said {
    int well, count, bad, extends;
    int watchdog; /* -1: not said; 0: WATCHDOG=trigger; 1: WATCHDOG=1 */
    int has_status, has_progress, has_extend, has_result;
    const char *status, *result;
    Py_ssize_t status_len, result_len;
    double progress;
    unsigned long long extend;
};

#define LINES_MAX 64    /* process.channel.LINES_MAX */
#define STATUS_MAX 1024 /* process.channel.STATUS_MAX */
#define USEC_DIGITS 20  /* digits of 2**64 - 1 */

static int space(char c) { /* Py_ISSPACE: what bytes.strip() and float() strip */
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

/* process.channel.percent: an integer or a decimal from 0 to 100, spaces around it allowed.
 * With the GIL held (PyOS_string_to_double, the conversion float() makes). */
static int percent(const char *s, size_t n, double *out) {
    size_t a = 0, b = n, digits = 0, dots = 0;
    while (a < b && space(s[a]))
        a++;
    while (b > a && space(s[b - 1]))
        b--;
    for (size_t i = a; i < b; i++) {
        if (s[i] >= '0' && s[i] <= '9')
            digits++;
        else if (s[i] != '.' || ++dots > 1)
            return 0;
    }
    if (digits == 0)
        return 0;
    char small[64], *text = b - a < sizeof small ? small : PyMem_Malloc(b - a + 1);
    if (text == NULL)
        return 0;
    memcpy(text, s + a, b - a);
    text[b - a] = '\0';
    double value = PyOS_string_to_double(text, NULL, NULL); /* too large: inf */
    if (text != small)
        PyMem_Free(text);
    if (PyErr_Occurred()) { /* not foreseen: a valid number by its characters */
        PyErr_Clear();
        return 0;
    }
    if (!(value >= 0 && value <= 100))
        return 0;
    *out = value;
    return 1;
}

/* process.channel.microseconds: an unsigned 64-bit decimal, digits only. */
static int microseconds(const char *s, size_t n, unsigned long long *out) {
    unsigned long long value = 0;
    if (n == 0 || n > USEC_DIGITS)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        unsigned digit = (unsigned)(s[i] - '0');
        if (value > (ULLONG_MAX - digit) / 10)
            return 0;
        value = value * 10 + digit;
    }
    *out = value;
    return 1;
}

static int named(const char *key, size_t len, const char *name) {
    return len == strlen(name) && memcmp(key, name, len) == 0;
}

/* process.channel.parse: one message, line by line. */
static void parse_into(const char *data, size_t size, struct said *s) {
    memset(s, 0, sizeof *s);
    s->well = 1;
    s->count = 1;
    s->watchdog = -1;
    size_t end = size, lines = 0;
    while (end > 0 && data[end - 1] == '\n')
        end--;
    for (size_t i = 0; i < end; i++)
        lines += data[i] == '\n';
    if (lines >= LINES_MAX) { /* refused whole */
        s->well = 0;
        s->bad = 1;
        return;
    }
    for (size_t at = 0; at <= size;) {
        const char *line = data + at, *newline = memchr(line, '\n', size - at);
        size_t len = newline ? (size_t)(newline - line) : size - at;
        at += len + 1;
        if (len == 0)
            continue;
        const char *equals = memchr(line, '=', len);
        if (equals == NULL || equals == line) {
            s->well = 0;
            continue;
        }
        size_t klen = (size_t)(equals - line), vlen = len - klen - 1;
        const char *value = equals + 1;
        if (named(line, klen, "STATUS")) {
            s->has_status = 1;
            s->status = value;
            s->status_len = (Py_ssize_t)(vlen < STATUS_MAX ? vlen : STATUS_MAX);
        } else if (named(line, klen, "X_JOBD_PROGRESS")) {
            double progress;
            if (percent(value, vlen, &progress)) {
                s->has_progress = 1;
                s->progress = progress;
            } else {
                s->well = 0;
            }
        } else if (named(line, klen, "EXTEND_TIMEOUT_USEC")) {
            unsigned long long usec;
            if (microseconds(value, vlen, &usec)) {
                s->has_extend = 1;
                s->extend = usec;
            } else {
                s->well = 0;
            }
        } else if (named(line, klen, "WATCHDOG")) {
            if (vlen == 1 && value[0] == '1') {
                if (s->watchdog != 0) /* a trigger sticks */
                    s->watchdog = 1;
            } else if (named(value, vlen, "trigger"))
                s->watchdog = 0;
            else
                s->well = 0;
        } else if (named(line, klen, "X_JOBD_RESULT")) {
            s->has_result = 1;
            s->result = value;
            s->result_len = (Py_ssize_t)vlen;
        }
    }
    s->bad = !s->well;
    s->extends = s->has_extend;
}

/* Said.merge: ``later`` taken into ``s``, each key as the later says it where it says it. */
static void merge(struct said *s, const struct said *later) {
    s->well &= later->well;
    s->count += later->count;
    s->bad += later->bad;
    s->extends += later->extends;
    if (later->has_status) {
        s->has_status = 1;
        s->status = later->status;
        s->status_len = later->status_len;
    }
    if (later->has_progress) {
        s->has_progress = 1;
        s->progress = later->progress;
    }
    if (later->has_extend) {
        s->has_extend = 1;
        s->extend = later->extend;
    }
    if (later->watchdog >= 0 && s->watchdog != 0) /* a trigger sticks */
        s->watchdog = later->watchdog;
    if (later->has_result) {
        s->has_result = 1;
        s->result = later->result;
        s->result_len = later->result_len;
    }
}

static PyObject *bytes_or_none(int has, const char *text, Py_ssize_t len) {
    return has ? PyBytes_FromStringAndSize(text, len) : Py_NewRef(Py_None);
}

/* Said's fields, in its order: (well, status, progress, extend, watchdog, result, count, bad,
 * extends). */
static PyObject *said_tuple(const struct said *s) {
    PyObject *parts[6] = {
        PyBool_FromLong(s->well),
        bytes_or_none(s->has_status, s->status, s->status_len),
        s->has_progress ? PyFloat_FromDouble(s->progress) : Py_NewRef(Py_None),
        s->has_extend ? PyLong_FromUnsignedLongLong(s->extend) : Py_NewRef(Py_None),
        s->watchdog < 0 ? Py_NewRef(Py_None) : PyBool_FromLong(s->watchdog),
        bytes_or_none(s->has_result, s->result, s->result_len),
    };
    PyObject *out = NULL;
    if (parts[0] && parts[1] && parts[2] && parts[3] && parts[4] && parts[5])
        out = Py_BuildValue("(OOOOOOiii)", parts[0], parts[1], parts[2], parts[3], parts[4],
                            parts[5], s->count, s->bad, s->extends);
    for (int i = 0; i < 6; i++)
        Py_XDECREF(parts[i]);
    return out;
}

/* Whether message b may join the run that message a ends: both clean, and the same sender,
 * or both strangers by their uid (whoever sent them: judged once). */
static int same_run(const struct message *a, const struct message *b) {
    int dirty = MSG_TRUNC | MSG_CTRUNC;
    if (a->nfds != 0 || b->nfds != 0 || (a->flags & dirty) || (b->flags & dirty))
        return 0;
    if (a->stranger || b->stranger)
        return a->stranger && b->stranger;
    return (a->leader == NO_LEADER) == (b->leader == NO_LEADER) &&
           a->pid == b->pid && a->sid == b->sid && a->alive == b->alive &&
           a->cgroup_len == b->cgroup_len &&
           (a->cgroup_len <= 0 || memcmp(a->cgroup, b->cgroup, a->cgroup_len) == 0);
}

/* One item: message ``m`` (the last of its run) with what the run says (NULL: cut, unparsed). */
static PyObject *item_of(const char *arena, const struct message *m, const struct said *said) {
    PyObject *fds = PyTuple_New(m->nfds);
    for (int k = 0; fds && k < m->nfds; k++)
        PyTuple_SET_ITEM(fds, k, PyLong_FromLong(m->fds[k]));
    PyObject *cgroup = m->cgroup_len < 0 ? Py_NewRef(Py_None)
                                         : PyBytes_FromStringAndSize(m->cgroup, m->cgroup_len);
    PyObject *told = said ? said_tuple(said) : Py_NewRef(Py_None);
    PyObject *item = (fds && cgroup && told)
                         ? Py_BuildValue("(iiOOiy#OOi)", m->pid, m->sid, cgroup,
                                         m->alive < 0 ? Py_None
                                         : m->alive ? Py_True
                                                    : Py_False,
                                         m->flags, arena + m->offset, (Py_ssize_t)m->size, fds,
                                         told, m->leader)
                         : NULL;
    Py_XDECREF(fds);
    Py_XDECREF(cgroup);
    Py_XDECREF(told);
    return item;
}

static PyObject *build(const char *arena, const struct message *messages, int count) {
    PyObject *out = PyList_New(0);
    struct said run, one;
    for (int i = 0; out && i < count; i++) {
        const struct message *m = &messages[i];
        int cut = (m->flags & MSG_TRUNC) != 0;
        if (!cut)
            parse_into(arena + m->offset, m->size, &one);
        if (i > 0 && same_run(&messages[i - 1], m) && !cut) {
            merge(&run, &one);
        } else {
            run = one;
        }
        if (i + 1 < count && !cut && same_run(m, &messages[i + 1]))
            continue; /* the run goes on */
        PyObject *item = item_of(arena, m, cut ? NULL : &run);
        if (!item || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static PyObject *parse(PyObject *self, PyObject *args) {
    Py_buffer data;
    struct said said;
    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    parse_into(data.buf, (size_t)data.len, &said);
    PyObject *out = said_tuple(&said);
    PyBuffer_Release(&data);
    return out;
}

/* Slots for descriptors: ``spares`` (descriptors of /dev/null held between batches) given up,
 * their number returned; each entry -1 then. */
static int give_up(int *spares, int n) {
    int free = 0;
    for (int i = 0; i < n; i++)
        if (spares[i] >= 0) {
            close(spares[i]);
            spares[i] = -1;
            free++;
        }
    return free;
}

/* ``spares`` held again, as many as there are free slots (one open, the others its copies). */
static void take_back(int *spares, int n) {
    int first = -1;
    for (int i = 0; i < n; i++) {
        spares[i] = first < 0 ? open("/dev/null", O_RDONLY | O_CLOEXEC)
                              : fcntl(first, F_DUPFD_CLOEXEC, 0);
        if (spares[i] < 0)
            break;
        if (first < 0)
            first = spares[i];
    }
}

/* How many slots are free now, ``wanted`` at most (each taken with a copy of ``fd``, all at
 * once, then let go). */
static int probe(int fd, int wanted) {
    int got[NEED], count = 0;
    while (count < wanted && count < NEED && (got[count] = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0)
        count++;
    for (int i = 0; i < count; i++)
        close(got[i]);
    return count;
}

/* One message read into ``messages[count]``: a run's leader pidfd (all of one session) kept
 * once, carried to its last message (the item); the slots it took out of ``free``. */
static void account(struct message *messages, int count, int *free) {
    struct message *m = &messages[count], *prev = count > 0 ? &messages[count - 1] : NULL;
    *free -= m->nfds + (m->leader >= 0);
    if (prev && prev->leader >= 0 && m->leader >= 0 && same_run(prev, m)) {
        close(m->leader);
        m->leader = prev->leader;
        prev->leader = -1;
        *free += 1;
    }
    if (*free < 0)
        *free = 0;
}

static PyObject *receive(PyObject *self, PyObject *args) {
    int fd, most, cgroups, room, keep;
    Py_buffer arena, sids, spares, uids;
    if (!PyArg_ParseTuple(args, "iw*iy*piw*py*", &fd, &arena, &most, &sids, &cgroups, &room,
                          &spares, &keep, &uids))
        return NULL;
    /* each call its own (~330 KiB): two channels in one process read at once */
    struct message *messages = PyMem_RawMalloc(sizeof(struct message) * BATCH_MAX);
    if (messages == NULL) {
        PyBuffer_Release(&arena);
        PyBuffer_Release(&sids);
        PyBuffer_Release(&spares);
        PyBuffer_Release(&uids);
        return PyErr_NoMemory();
    }
    int limit = most < BATCH_MAX ? most : BATCH_MAX, nspares = (int)(spares.len / sizeof(int));
    int count = 0, failed = 0, error = 0;
    size_t offset = 0;
    Py_BEGIN_ALLOW_THREADS
    /* the socket empty (what a call finds at the end of each wake of the thread): nothing to
     * read, no spare given up and taken back (eight system calls) */
    char none;
    int empty = recv(fd, &none, 0, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN;
    int free = empty ? 0 : give_up(spares.buf, nspares);
    for (; !empty && count < limit && offset + MESSAGE_MAX <= (size_t)arena.len; count++) {
        /* a message's descriptors come before its pidfd: one more only while a descriptor
         * and a pidfd have room (the first of the batch whatever: it has the spares) */
        if (free < NEED) /* as many as are free in fact (those counted among them) */
            free = probe(fd, NEED);
        if (free < NEED && count > 0)
            break;
        int got = read_one(fd, arena.buf, offset, &messages[count], sids.buf,
                           (size_t)sids.len / sizeof(int), uids.buf,
                           (size_t)uids.len / sizeof(unsigned), cgroups, room >= FDS_MAX, keep);
        if (got <= 0) {
            failed = got < 0;
            error = errno;
            break;
        }
        offset += messages[count].size;
        room -= messages[count].nfds;
        account(messages, count, &free);
    }
    if (!empty)
        take_back(spares.buf, nspares);
    Py_END_ALLOW_THREADS
    PyObject *out = (failed && count == 0) ? (errno = error, PyErr_SetFromErrno(PyExc_OSError))
                                          : build(arena.buf, messages, count);
    if (out == NULL) /* the leaders' pidfds are nobody's */
        for (int i = 0; i < count; i++)
            if (messages[i].leader >= 0)
                close(messages[i].leader);
    PyMem_RawFree(messages);
    PyBuffer_Release(&arena);
    PyBuffer_Release(&sids);
    PyBuffer_Release(&spares);
    PyBuffer_Release(&uids);
    return out;
}

static PyMethodDef methods[] = {
    {"receive", receive, METH_VARARGS,
     "receive(fd, arena, most, sids, cgroups, room, spares, keep, uids)\n"
     "-> [(pid, sid, cgroup, alive, flags, data, fds, said, leader)]"},
    {"parse", parse, METH_VARARGS,
     "parse(data) -> (well, status, progress, extend, watchdog, result, count, bad, extends)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_receive",
                                    "The handlers' channel, read a batch at a time.", -1, methods};

PyMODINIT_FUNC PyInit__receive(void) { return PyModule_Create(&module); }
