/* jobd.process._clonexec: start a handler without waiting for it to reach exec.
 *
 * vfork (what subprocess and posix_spawn use) suspends the caller until the child has called
 * exec; on a busy machine that wait is the scheduler's (the child queues behind running
 * handlers), and it was most of the daemon's loop time a job (README "Performance"). Here the
 * child is cloned with CLONE_VM but without CLONE_VFORK: it shares the daemon's memory, runs on
 * a stack of its own, and the caller goes on at once, with the child's pid.
 *
 * What makes that safe:
 * - the child touches only its own mapping (its arguments, environment and stack, built here
 *   before the clone and never written again by the caller) and calls no C library function:
 *   each system call is a raw one, so it never writes errno (the caller thread's, shared) nor
 *   resolves a symbol lazily (a write to shared memory);
 * - the mapping is freed only once the kernel says the child has left it: CLONE_PARENT_SETTID
 *   writes the child's pid into its first word before the child runs, CLONE_CHILD_CLEARTID
 *   clears that word when the child execs or exits, and then either kcmp(KCMP_VM) says it no
 *   longer shares the daemon's memory, or the child's copy of the report pipe is closed
 *   (``gone``); each call frees the mappings left since;
 * - every signal is blocked in the calling thread across the clone, so the child starts with
 *   all of them blocked, sets every action to the default (its own copy of the table: no
 *   CLONE_SIGHAND), and unblocks them only just before exec: no handler of the daemon ever runs
 *   in the child;
 * - a failure before or at exec is written on the report pipe (close-on-exec, so exec closes
 *   it) as "OSError:<errno in hex>:", the format of subprocess's own helper, and the child
 *   exits 127; the caller reads it once the child has exited.
 *
 * A start may carry a deadline (CLOCK_BOOTTIME, in nanoseconds): the last moment the job's
 * lease is known to hold (``Admission.lease_held``). The child reads that clock as its very
 * last step before execve (a raw clock_gettime: no vDSO, which is the C library's) and, past
 * the deadline, does not exec: it reports LAPSED, a code no errno can be (the kernel's are
 * below 4096), and exits. However long the daemon was stopped between its own check and the
 * clone, or the child waited for a CPU, what is left is the execve itself.
 *
 * x86_64 and aarch64 Linux only (the raw system calls); elsewhere the module is not built and
 * jobd starts handlers with vfork as before.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <linux/futex.h>
#include <linux/kcmp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__linux__) || !(defined(__x86_64__) || defined(__aarch64__))
#error "jobd.process._clonexec: x86_64 or aarch64 Linux only"
#endif

#define CHILD_STACK (64 * 1024)
#define LAPSED 0x10000L  /* "lease lapsed before exec": reported as "OSError:10000:" */
#define NO_DEADLINE LLONG_MAX

static inline long raw4(long n, long a, long b, long c, long d) {
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
#else
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
#endif
}

static inline long raw3(long n, long a, long b, long c) { return raw4(n, a, b, c, 0); }

/* The kernel's struct sigaction (not the C library's). */
struct ksigaction {
    void *handler;
    unsigned long flags;
    void *restorer;
    unsigned long mask;
};

/* One start: its first word is the child's pid until the child begins its exec (or exits). */
struct start {
    volatile pid_t tid;
    int fds[3];
    int report;
    char *path;
    char **argv;
    char **envp;
    size_t size;
    long long deadline;  /* CLOCK_BOOTTIME nanoseconds past which the child does not exec */
    double born;  /* CLOCK_MONOTONIC seconds at the clone */
    int watch;  /* the report pipe's read end, our own copy (-1: none) */
    pid_t pid;
    struct start *next;
};

static double monotonic(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static struct start *in_flight = NULL;  /* guarded by the GIL */
static int waiters = 0;  /* calls of settle() waiting without the GIL: nothing is freed meanwhile */

/* Whether the child has left the daemon's memory: exec'd into its own, or exited. The kernel
 * clears the tid word as an exec begins to replace the memory, a moment before the child stops
 * sharing it (exec_mm_release, then the switch in exec_mmap): a score the daemon wrote in that
 * moment would still reach the child. So, once the word is cleared, one of two proofs:
 * - kcmp(KCMP_VM) says the child's memory is another: it needs ptrace access to the child,
 *   which the kernel refuses a non-dumpable daemon without CAP_SYS_PTRACE (the shipped unit:
 *   an unprivileged user, non-dumpable) while the child shares its memory; a refusal proves
 *   nothing;
 * - the report pipe has no writer left: the child's copy is closed by its exec (close-on-exec,
 *   after the switch of memory) or its exit (after it let go of the memory), and the daemon
 *   closed its own at the start. Any process may ask this.
 * Where neither holds, the child is taken as still there (``settle`` waits up to ``stale``
 * seconds, then writes anyway). */
static int gone(struct start *s) {
    if (__atomic_load_n(&s->tid, __ATOMIC_ACQUIRE) != 0)
        return 0;
    if (syscall(SYS_kcmp, getpid(), s->pid, KCMP_VM, 0, 0) > 0)
        return 1;
    if (s->watch >= 0) {
        struct pollfd p = {s->watch, 0, 0};
        return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
    }
    /* No pipe to watch (its copy could not be made): as before, kcmp's "the same" long after
     * the clear is another task that got the child's pid once it was reaped. */
    return monotonic() - s->born > 10;
}

static void sweep(void) {
    if (waiters)
        return;
    struct start **at = &in_flight;
    while (*at) {
        struct start *s = *at;
        if (gone(s)) {
            *at = s->next;
            if (s->watch >= 0)
                close(s->watch);
            munmap(s, s->size);
        } else {
            at = &s->next;
        }
    }
}

__attribute__((noinline))
static int child(void *arg) {
    struct start *s = arg;
    struct ksigaction dfl = {0};  /* SIG_DFL */
    for (long sig = 1; sig < 65; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP)
            raw4(SYS_rt_sigaction, sig, (long)&dfl, 0, 8);
    }
    long err = raw3(SYS_setsid, 0, 0, 0);
    for (long i = 0; err >= 0 && i < 3; i++)
        err = raw3(SYS_dup3, s->fds[i], i, 0);
    if (err >= 0) {
        unsigned long none = 0;
        raw4(SYS_rt_sigprocmask, SIG_SETMASK, (long)&none, 0, 8);
        struct timespec now = {0, 0};
        if (s->deadline != NO_DEADLINE)  /* the last step before the exec: nothing in between */
            err = raw3(SYS_clock_gettime, CLOCK_BOOTTIME, (long)&now, 0);
        if (err >= 0 && s->deadline != NO_DEADLINE
            && (long long)now.tv_sec * 1000000000LL + now.tv_nsec >= s->deadline)
            err = -LAPSED;
        else if (err >= 0)
            err = raw3(SYS_execve, (long)s->path, (long)s->argv, (long)s->envp);
        unsigned long all = ~0UL;
        raw4(SYS_rt_sigprocmask, SIG_SETMASK, (long)&all, 0, 8);
    }
    /* "OSError:<errno in hex>:" */
    static const char head[] = "OSError:";
    char msg[32];
    int n = 0;
    while (head[n]) {
        msg[n] = head[n];
        n++;
    }
    unsigned long code = (unsigned long)(-err);
    char hex[16];
    int k = 0;
    do {
        hex[k++] = "0123456789abcdef"[code & 15];
        code >>= 4;
    } while (code && k < 16);
    while (k)
        msg[n++] = hex[--k];
    msg[n++] = ':';
    raw3(SYS_write, s->report, (long)msg, n);
    raw3(SYS_exit, 127, 0, 0);
    return 127;
}

/* Copies of ``items`` (bytes) into ``*cursor``, as a NULL-ended array at ``table``. */
static void lay_out(PyObject *items, char **table, char **cursor) {
    Py_ssize_t n = PyList_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(items, i);
        Py_ssize_t len = PyBytes_GET_SIZE(b);
        memcpy(*cursor, PyBytes_AS_STRING(b), len + 1);
        table[i] = *cursor;
        *cursor += len + 1;
    }
    table[n] = NULL;
}

static int sized(PyObject *items, size_t *bytes) {
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "a list of bytes");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *b = PyList_GET_ITEM(items, i);
        if (!PyBytes_Check(b)) {
            PyErr_SetString(PyExc_TypeError, "a list of bytes");
            return -1;
        }
        if (memchr(PyBytes_AS_STRING(b), 0, PyBytes_GET_SIZE(b))) {
            PyErr_SetString(PyExc_ValueError, "embedded null byte");
            return -1;
        }
        *bytes += PyBytes_GET_SIZE(b) + 1 + sizeof(char *);
    }
    *bytes += sizeof(char *);
    return 0;
}

static PyObject *start(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *argv, *envp;
    int fds[3], report, report_r;
    long long deadline = NO_DEADLINE;
    if (!PyArg_ParseTuple(args, "O!O!iiiii|L", &PyList_Type, &argv, &PyList_Type, &envp, &fds[0],
                          &fds[1], &fds[2], &report, &report_r, &deadline))
        return NULL;
    if (PyList_GET_SIZE(argv) < 1) {
        PyErr_SetString(PyExc_ValueError, "argv is empty");
        return NULL;
    }
    for (int i = 0; i < 3; i++) {
        if (fds[i] < 3) {
            PyErr_SetString(PyExc_ValueError, "descriptors 0 to 2 cannot be passed");
            return NULL;
        }
    }
    size_t bytes = sizeof(struct start) + 16;
    if (sized(argv, &bytes) < 0 || sized(envp, &bytes) < 0)
        return NULL;
    long page = sysconf(_SC_PAGESIZE);
    size_t size = ((bytes + CHILD_STACK + page - 1) / page) * page;
    sweep();
    struct start *s = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
        return PyErr_SetFromErrno(PyExc_OSError);
    s->size = size;
    s->deadline = deadline;
    s->born = monotonic();
    s->watch = fcntl(report_r, F_DUPFD_CLOEXEC, 3);  /* kept until the start is freed */
    memcpy(s->fds, fds, sizeof(fds));
    s->report = report;
    char *cursor = (char *)(s + 1);
    cursor = (char *)(((uintptr_t)cursor + 15) & ~(uintptr_t)15);
    s->argv = (char **)cursor;
    cursor += (PyList_GET_SIZE(argv) + 1) * sizeof(char *);
    s->envp = (char **)cursor;
    cursor += (PyList_GET_SIZE(envp) + 1) * sizeof(char *);
    lay_out(argv, s->argv, &cursor);
    lay_out(envp, s->envp, &cursor);
    s->path = s->argv[0];
    char *stack_top = (char *)s + size;  /* 16-byte aligned: the mapping's end */

    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int flags = CLONE_VM | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD;
    pid_t pid = clone(child, stack_top, flags, s, &s->tid, NULL, &s->tid);
    int saved = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        if (s->watch >= 0)
            close(s->watch);
        munmap(s, size);
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    s->pid = pid;
    s->next = in_flight;
    in_flight = s;
    /* The child puts itself in a session (and group) of its own. This cannot do it for it (a
     * group leader's setsid is refused): a stop before the child got there signals the child
     * itself too (its pidfd), which every signal reaches, blocked until its exec. */
    return PyLong_FromLong(pid);
}

static PyObject *in_flight_count(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    sweep();
    long n = 0;
    for (struct start *s = in_flight; s; s = s->next)
        n++;
    return PyLong_FromLong(n);
}

/* Wait (without the GIL) until every child started here less than ``stale`` seconds ago has
 * left its mapping, or ``timeout`` seconds have passed; True when none of those is left. A child
 * before its exec for longer (stopped, or exec'ing from a hung file system) is not waited for.
 * The kernel wakes the futex on the first word of a start when it clears it
 * (CLONE_CHILD_CLEARTID). */
static PyObject *settle(PyObject *self, PyObject *args) {
    (void)self;
    double timeout, stale;
    if (!PyArg_ParseTuple(args, "dd", &timeout, &stale))
        return NULL;
    sweep();
    double now = monotonic(), end = now + timeout;
    int waiting = 0;
    for (struct start *s = in_flight; s; s = s->next)
        waiting |= s->born + stale > now;
    if (!waiting)
        Py_RETURN_TRUE;
    if (timeout <= 0)
        Py_RETURN_FALSE;
    waiters++;
    Py_BEGIN_ALLOW_THREADS
    for (struct start *s = in_flight; s; s = s->next) {
        pid_t tid;
        double until = s->born + stale < end ? s->born + stale : end;
        while (!gone(s)) {
            double left = until - monotonic();
            if (left <= 0)
                break;
            if ((tid = __atomic_load_n(&s->tid, __ATOMIC_ACQUIRE)) != 0) {
                struct timespec wait = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
                syscall(SYS_futex, &s->tid, FUTEX_WAIT, tid, &wait, NULL, 0);
            } else {  /* between the two steps of its exec: microseconds */
                struct timespec pause = {0, 20000};
                nanosleep(&pause, NULL);
            }
        }
    }
    Py_END_ALLOW_THREADS
    waiters--;
    sweep();
    now = monotonic();
    for (struct start *s = in_flight; s; s = s->next) {
        if (s->born + stale > now)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"settle", settle, METH_VARARGS,
     "settle(timeout, stale) -> bool: wait until every child started less than stale seconds "
     "ago has exec'd or exited (True), or timeout seconds (False)."},
    {"start", start, METH_VARARGS,
     "start(argv, envp, stdin, stdout, stderr, report_w, report_r[, deadline]) -> pid: clone "
     "and exec argv[0], not waiting for the exec; a failure is written on report_w (report_r, "
     "its read end, is watched for the child's exec: a copy is kept). With a deadline "
     "(CLOCK_BOOTTIME nanoseconds), a child that reaches its exec at or past it does not exec: "
     "it reports code 0x10000 (no errno) and exits 127."},
    {"in_flight", in_flight_count, METH_NOARGS,
     "Starts whose child has not yet left its mapping (exec'd or exited)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_clonexec", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__clonexec(void) { return PyModule_Create(&module); }
