/* counterprof native core: perf_event_open, group reads, the sampling thread
 * and the paused-child spawn used by `counterprof run`.
 *
 * Everything here is plain C with no Python API: the sampling thread never
 * touches the interpreter, so it never needs the GIL. Python (through cffi,
 * API mode) drains finished ticks in column arrays.
 *
 * Errors are returned as -errno; Python turns them into counterprof.errors
 * types in one place (counterprof/errors.py).
 */
#ifndef COUNTERPROF_NATIVE_H
#define COUNTERPROF_NATIVE_H

#include <stddef.h>
#include <stdint.h>

/* What to count and how: the fields of perf_event_attr that counterprof sets. */
struct cp_event_spec {
    uint32_t type;
    uint64_t config;
    uint64_t config1;
    uint64_t config2;
    uint64_t read_format;
    uint8_t disabled;
    uint8_t inherit;
    uint8_t enable_on_exec;
    uint8_t pinned;
    uint8_t exclusive;
    uint8_t exclude_user;
    uint8_t exclude_kernel;
    uint8_t exclude_hv;
    uint8_t exclude_idle;
    uint8_t exclude_host;
    uint8_t exclude_guest;
    uint8_t precise_ip;
};

/* Fill `out` (at least cp_attr_size() bytes) with the perf_event_attr the
 * syscall would receive. Exposed so tests can check every bit, as perf's own
 * attr tests do. */
size_t cp_attr_size(void);
void cp_build_attr(const struct cp_event_spec *spec, void *out);

/* perf_event_open with PERF_FLAG_FD_CLOEXEC: an fd, or -errno. */
int cp_event_open(const struct cp_event_spec *spec, int pid, int cpu, int group_fd);
int cp_ioctl_enable(int fd, int whole_group);
int cp_ioctl_disable(int fd, int whole_group);
int cp_ioctl_reset(int fd, int whole_group);
/* One read() of a counter fd into `words`: the number of u64 words read, or -errno. */
int cp_read_words(int fd, uint64_t *words, int max_words);
int cp_close(int fd);
int cp_gettid(void);

/* Scaling for multiplexing, per counter and interval:
 *   value * enabled / running; unknown (returns 0) when it was enabled but never ran.
 * A counter that was not enabled at all in the interval (its task slept) is
 * known and unchanged: returns 1 with *scaled = value. */
int cp_scale_delta(uint64_t d_value, uint64_t d_enabled, uint64_t d_running, double *scaled);

/* Sum of n counters (threads, CPUs) that make one series. Returns 1 when the
 * sum is known; *quality is sum(running) / sum(enabled), 1.0 when nothing was enabled. */
int cp_aggregate(int n, const uint64_t *d_value, const uint64_t *d_enabled,
                 const uint64_t *d_running, double *value, float *quality);

/* The sampler: a pthread that reads every added group each interval and keeps
 * scaled per-slot deltas in a ring of ticks. A slot is one output series
 * (metric x entity); several group members may feed one slot (threads summed). */
typedef struct cp_sampler cp_sampler;

struct cp_sampler_stats {
    uint64_t ticks;          /* ticks stored in the ring since start */
    uint64_t coalesced;      /* ticks merged into the next one because the ring was full */
    uint64_t read_errors;    /* failed group reads */
    int64_t last_read_errno;
    uint64_t late_ticks;     /* deadlines missed by more than one interval */
    int64_t cpu_ns;          /* CPU time used by the sampling thread */
};

/* Per series, over the whole run: ticks with a known value, ticks unknown (enabled but
 * never scheduled), and the smallest share of an interval it was counted. */
struct cp_slot_stats {
    uint64_t known;
    uint64_t unknown;
    float min_quality;
};

/* Creates the sampler and its (idle) thread. NULL and *err = -errno on failure.
 * The thread exists before any counter is opened, so inherited task counters never
 * count it. */
cp_sampler *cp_sampler_new(int *err);
int cp_sampler_thread_tid(cp_sampler *s);
/* leader_fd must have been opened with PERF_FORMAT_GROUP|TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING. */
int cp_sampler_add_group(cp_sampler *s, int leader_fd, int nmembers, const int32_t *member_slots);
/* Sizes the ring (ring_ticks ticks of nslots records), takes the baseline read,
 * then ticks every interval_ns. A sampler starts once. */
int cp_sampler_start(cp_sampler *s, int nslots, int ring_ticks, int64_t interval_ns);
/* One last tick (so totals include everything up to now), then idle. Idempotent. */
int cp_sampler_stop(cp_sampler *s);
/* Move up to max_records finished records (whole ticks only) into the column
 * arrays; validity is an Arrow bitmap (bit i set = value i known). Returns the count. */
int cp_sampler_drain(cp_sampler *s, int max_records, int64_t *time_ns, int64_t *duration_ns,
                     int32_t *slot, double *value, float *quality, uint8_t *validity);
int cp_sampler_pending(cp_sampler *s);
void cp_sampler_get_stats(cp_sampler *s, struct cp_sampler_stats *out);
int cp_sampler_slot_stats(cp_sampler *s, int slot, struct cp_slot_stats *out);
/* Drained times are monotonic ns plus this offset (the session clock's epoch offset). */
void cp_sampler_set_time_offset(cp_sampler *s, int64_t offset_ns);
/* A schedstat file (/proc/PID/task/TID/schedstat) read on the sampler's own tick: the threads
 * collector's critical thread, every every_ticks ticks, so no second thread wakes per interval.
 * The fd stays the caller's (it is only read under the sampler's lock: once this returns, the
 * previous fd is no longer touched and may be closed); fd < 0 stops the reads. Returns the new
 * watch's epoch (> 0): readings carry it, so a drain tells the previous thread's from this one's. */
int cp_sampler_watch_schedstat(cp_sampler *s, int fd, int every_ticks);
/* The same for several threads at once (a job whose critical threads are its ranks' main
 * threads): fds[i]'s readings carry the epoch first + i, first being the value returned (n = 0:
 * no reads, as fd < 0 above). At most CP_SCHED_WATCH fds; -EINVAL beyond. A reading that fails
 * stops that fd's reads only. */
enum { CP_SCHED_WATCH = 64 };
int cp_sampler_watch_schedstats(cp_sampler *s, int n, const int *fds, int every_ticks);
/* Up to max readings, oldest first: tick time (monotonic + offset), the first two schedstat
 * fields (run ns, run-queue wait ns), the watch's epoch. run_ns < 0: the read failed (the thread
 * is gone; the watch is off). The ring holds CP_SCHED_RING readings; beyond it the newest one is
 * overwritten (they are cumulative: only resolution is lost). Returns the count. */
enum { CP_SCHED_RING = 4096 };
int cp_sampler_drain_schedstat(cp_sampler *s, int max, int64_t *time_ns, int64_t *run_ns,
                               int64_t *wait_ns, int32_t *epoch);
/* Riders: work done on the sampler's own thread every every_ticks ticks (after the counters are
 * read and stored), so a collector that samples at the perf interval wakes no thread of its own.
 * fn(arg, tick time in CLOCK_MONOTONIC ns) runs outside the sampler's lock (it may call sampler
 * functions) and must not block. Returns the rider's id (> 0) or -errno (-ENOSPC beyond
 * CP_MAX_RIDERS). Once cp_sampler_remove_rider returns, fn is never called again (a call in
 * progress is waited for): the caller may then free arg. */
enum { CP_MAX_RIDERS = 8 };
int cp_sampler_add_rider(cp_sampler *s, int (*fn)(void *arg, int64_t now_ns), void *arg, int every_ticks);
int cp_sampler_remove_rider(cp_sampler *s, int id);
/* Stops and joins the thread; does not close the counter fds. */
void cp_sampler_free(cp_sampler *s);

/* /proc readers for the host collector (procstat.c). `proc` is procfs's mount point. */
struct cp_tree_stats {
    int root_alive;            /* 0: the root process is gone (or a zombie) */
    uint32_t processes;
    uint32_t threads;
    double user_s;             /* utime + cutime summed over the live tree */
    double system_s;           /* stime + cstime */
    uint64_t rss_bytes;
    uint64_t read_bytes;       /* storage I/O (/proc/PID/io), where readable */
    uint64_t write_bytes;
    uint64_t ctx_voluntary;    /* of each process's main thread (/proc/PID/status) */
    uint64_t ctx_involuntary;
    double run_delay_s;        /* main threads' time runnable but waiting for a CPU (schedstat) */
};

struct cp_system_stats {
    double cpu_total_s;        /* all CPUs, since boot */
    double cpu_idle_s;
    double cpu_iowait_s;
    uint64_t mem_total_bytes;
    uint64_t mem_available_bytes;
};
/* A reader for one root (root <= 0: system figures only). The root's and the system's
 * files stay open and are re-read with pread, so a sample costs few syscalls. */
typedef struct cp_procstat cp_procstat;
cp_procstat *cp_procstat_open(const char *proc, int root, int *err);
void cp_procstat_close(cp_procstat *h);
/* Both readings in one call (the GIL is released once per sample). */
int cp_procstat_sample(cp_procstat *h, struct cp_tree_stats *tree, struct cp_system_stats *sys);

/* The host collector's rows, made in C: cp_procstat_record takes one sample (the first is the
 * baseline) and turns it into rows -- deltas of the cumulative figures (never negative: a
 * process that exits unreaped takes its counts along), gauges, the system's CPU shares -- kept
 * until drained. A sample costs Python one call; rows leave as column arrays once a second.
 * Metric indexes, in this order: */
enum {
    CP_HOST_CPU_USER, CP_HOST_CPU_SYSTEM, CP_HOST_RSS, CP_HOST_READ_BYTES, CP_HOST_WRITE_BYTES,
    CP_HOST_CTX_VOLUNTARY, CP_HOST_CTX_INVOLUNTARY, CP_HOST_RUN_DELAY, CP_HOST_THREADS,
    CP_HOST_PROCESSES, CP_HOST_SYS_CPU_UTIL, CP_HOST_SYS_CPU_IOWAIT, CP_HOST_SYS_MEM_USED,
    CP_HOST_SYS_MEM_AVAILABLE, CP_HOST_METRICS
};
/* Row times: CLOCK_MONOTONIC plus this offset (the session clock's). */
void cp_procstat_set_time_offset(cp_procstat *h, int64_t offset_ns);
/* The system rows (system.*) once per period_ns at most (0, the default: every record); their
 * durations are the true span since the last system reading. */
void cp_procstat_set_system_period(cp_procstat *h, int64_t period_ns);
/* Rows added (0 for the baseline), or -errno. */
int cp_procstat_record(cp_procstat *h);
/* 1 once the root has exited (its rows stop), else 0. */
int cp_procstat_root_gone(cp_procstat *h);
int cp_procstat_pending(cp_procstat *h);
/* Up to max rows, oldest first; duration_valid is a bitmap (gauges have no duration). */
int cp_procstat_drain(cp_procstat *h, int max, int64_t *time_ns, int64_t *duration_ns,
                      uint8_t *duration_valid, int32_t *metric, double *value);

/* Thread states of a process tree, for the threads collector (procstat.c): per thread, its
 * on-CPU time and run-queue wait over the interval from /proc/PID/task/TID/schedstat. Each
 * thread's schedstat (and children list) stays open and is re-read with pread, within a budget
 * of max_fds descriptors (beyond it, files are opened per sample): in-process, the descriptors
 * are the workload's. */
struct cp_thread {
    int32_t tid;
    int32_t pid;               /* its process (thread group) */
    int32_t ppid;              /* its process's parent in the tree; 0 for the root */
    int32_t fresh;             /* 1: first seen in this sample */
    double run_s;              /* on-CPU time over the interval (schedstat field 1) */
    double wait_s;             /* runnable but waiting for a CPU (schedstat field 2) */
    double life_s;             /* the part of the interval it existed: the interval, or since birth */
    char comm[16];
};
struct cp_threads_stats {
    int root_alive;            /* 0: the root process is gone (or a zombie) */
    int n;                     /* threads of the live tree, in `threads` */
    int changed;               /* threads came or went or were renamed since the last sample */
    double interval_s;         /* since the previous sample (CLOCK_BOOTTIME); 0 on the first */
    const struct cp_thread *threads;   /* valid until the next sample */
};
typedef struct cp_threads cp_threads;
/* Every process under proc (the contenders' table): pid, start time and utime+stime in clock
 * ticks, ppid, and comm (16 bytes each, NUL-padded). Writes at most cap; returns how many
 * were found (more than cap: call again with room), or -errno when proc cannot be listed. */
int cp_process_table(const char *proc, int cap, int32_t *pid, int64_t *start_ticks, int32_t *ppid,
                     int64_t *cpu_ticks, char *comm);
cp_threads *cp_threads_open(const char *proc, int root, int max_fds, int *err);
void cp_threads_close(cp_threads *h);
/* One walk of the tree. full: also re-read every thread's name and every thread's children
 * (else only each process's main thread's, as most processes fork from it and exec renames
 * it); the first sample is full. A thread first seen now counts from its birth when it was
 * born since the walk that would have seen it began, else from now (its earlier life is not
 * ours: a tree attached to). */
int cp_threads_sample(cp_threads *h, int full, struct cp_threads_stats *out);

/* The walk on the perf sampler's tick (cp_sampler_ride_threads): the threads collector's Python
 * thread then wakes only to drain, about once a second, and when a walk needs it. Python gives
 * every thread its role (cp_threads_set_roles, by tid); a walk due (every walk_ns, big_walk_ns
 * above small_up_to threads, or at once when the watched children file changed) sums on-CPU and
 * run-queue time by role into a row. A walk Python must see -- threads came, went or were
 * renamed, a thread without a role, the root gone -- is kept instead (its snapshot, valid until
 * the next set_roles) and the wake fd (an eventfd) is written; no walk runs until Python has set
 * the roles again. Deltas are cumulative: a walk not taken loses resolution, not time.
 * Roles, as collectors/threads.py numbers them: */
enum { CP_ROLE_MAIN, CP_ROLE_INTRAOP, CP_ROLE_LOADER, CP_ROLE_COMM, CP_ROLE_OTHER, CP_ROLE_EXCLUDED,
       CP_ROLES };
/* Walk row times: CLOCK_MONOTONIC plus offset_ns; last_walk_ns: the previous walk's time (ns on
 * that axis), from which the first walk's duration counts; tick_ns: how often cp_threads_tick is
 * called (a walk may run half of it early). Configures; walks begin once a rider calls
 * cp_threads_tick. */
int cp_threads_ride_setup(cp_threads *h, int64_t offset_ns, int64_t last_walk_ns, int64_t tick_ns,
                          int64_t walk_ns, int64_t big_walk_ns, int small_up_to, int64_t full_every_ns);
/* The rider's function (for cp_sampler_add_rider; arg is the cp_threads). */
int cp_threads_tick(void *h, int64_t now_ns);
/* Roles by tid (threads not in the current walk are ignored), the DataLoader worker count the rows
 * carry; clears a kept walk, so walks resume. */
int cp_threads_set_roles(cp_threads *h, int n, const int32_t *tids, const int32_t *roles, int loader_workers);
/* The critical thread's children file (fd < 0: none), read at each walk and compared on every
 * tick. The fd stays the caller's; once this returns the previous one is no longer read. */
void cp_threads_watch_children(cp_threads *h, int fd);
/* The kept walk: 1 (out, its time and duration filled; out->threads valid until set_roles), 0
 * when none, or the -errno a walk on the tick failed with. */
int cp_threads_kept_walk(cp_threads *h, struct cp_threads_stats *out, int64_t *time_ns, int64_t *duration_ns);
/* The time of the last walk (either kind), on the offset axis. */
int64_t cp_threads_last_walk_ns(cp_threads *h);
/* Walk rows not drained yet; drain up to max, oldest first (run/wait: CP_ROLES per row). */
int cp_threads_walks_pending(cp_threads *h);
int cp_threads_drain_walks(cp_threads *h, int max, int64_t *time_ns, int64_t *duration_ns, double *run_s,
                           double *wait_s, int32_t *intraop, int32_t *loader_workers);
/* The eventfd Python waits on; cp_threads_wake writes it (a stop, a mode change). */
int cp_threads_wake_fd(cp_threads *h);
void cp_threads_wake(cp_threads *h);

/* Riders for the two collectors' C samplers: cp_procstat_record every every_ticks ticks (its
 * errors kept for cp_procstat_tick_error), cp_threads_tick every every_ticks ticks (the threads
 * interval: a walk runs when due, else the children file is compared). The handles must outlive
 * the rider (cp_sampler_remove_rider first). */
int cp_procstat_tick(void *h, int64_t now_ns);
/* The first error a record on the tick returned since the last call (0: none); clears it. */
int cp_procstat_tick_error(cp_procstat *h);
int cp_sampler_ride_procstat(cp_sampler *s, cp_procstat *h, int every_ticks);
int cp_sampler_ride_threads(cp_sampler *s, cp_threads *h, int every_ticks);

/* The spill (spill.c): what the sampler's thread takes, in one of two mapped files of the run as
 * it is taken (a memcpy per record; the page cache keeps it when the process is killed), so a
 * killed profiler loses nothing it had read while the drain wakes only every few seconds.
 * Records: uint32 kind, uint32 bytes, payload. cp_spill_rotate (the drain, before it takes the
 * rings) empties the other file and makes it current. The fds stay the caller's. Blocks are
 * allocated before they are mapped: a full disk turns the spill off (-errno in the stats). */
typedef struct cp_spill cp_spill;
enum { CP_SPILL_PERF = 1, CP_SPILL_HOST = 2, CP_SPILL_WALK = 3, CP_SPILL_SCHED = 4, CP_SPILL_SETTLED = 5 };
struct cp_spill_stats {
    uint64_t records;
    uint64_t bytes;          /* written to the files since start */
    int error;               /* 0, or the -errno that turned it off */
};
cp_spill *cp_spill_new(int fd0, int fd1, int *err);
int cp_spill_add(cp_spill *sp, uint32_t kind, int nparts, const void *const *parts, const uint32_t *lens);
int cp_spill_rotate(cp_spill *sp);
void cp_spill_get_stats(cp_spill *sp, struct cp_spill_stats *out);
void cp_spill_free(cp_spill *sp);
/* Who adds to it (NULL: nobody): the sampler its ticks and readings; the host and threads
 * handles their rows taken on its tick (set while they ride; clear before the
 * spill is freed). Payloads: PERF: int64 time, int64 duration, int32 nslots, int32 0, double
 * value[nslots], float quality[nslots], uint8 valid[nslots]; HOST: int32 n, int32 0, int64
 * time[n], int64 duration[n] (-1: none), int32 metric[n], double value[n]; WALK: int64 time,
 * int64 duration, double run_s[CP_ROLES], double wait_s[CP_ROLES], int32 intraop, int32
 * loader_workers; SCHED: int64 time, run, wait, int32 epoch, int32 0, then the reading before
 * it the same way (epoch 0: none); SETTLED (added by the threads collector in Python when it takes
 * the critical threads' rows): int64 time, run, wait of the last reading taken, int32 epoch,
 * int32 0, int64 run and wait ns carried past it. Times are on the session's axis (monotonic +
 * offset). */
void cp_sampler_set_spill(cp_sampler *s, cp_spill *sp);
cp_spill *cp_sampler_spill(cp_sampler *s);
void cp_procstat_set_spill(cp_procstat *h, cp_spill *sp);
void cp_threads_set_spill(cp_threads *h, cp_spill *sp);

/* fork, then the child waits on a pipe before exec so counters can be opened on
 * its pid first (perf stat's handshake). Write one byte to *go_fd to let it
 * exec; close *go_fd without writing to make it exit 255. *status_fd reads EOF
 * when exec succeeded, or the exec errno (4 bytes) when it failed.
 * envp NULL keeps the current environment. Returns 0 or -errno. */
int cp_spawn_paused(char *const argv[], char *const envp[], int *pid, int *go_fd, int *status_fd);

/* Kineto trace events -> column arrays (kineto.c). Python allocates the arrays (capacity rows;
 * the *_off arrays capacity + 1, with *_off[0] = 0) and calls cp_kineto_events repeatedly on
 * a refilled buffer; rows accumulate until status FULL. Integers absent from an event (or not
 * integers) are CP_KINETO_NONE. */
#define CP_KINETO_NONE INT64_MIN
enum { CP_KINETO_MORE = 0, CP_KINETO_END = 1, CP_KINETO_FULL = 2, CP_KINETO_ERROR = -1 };
struct cp_kineto_cols {
    int capacity;
    int rows;
    int64_t *ts_ns;
    int64_t *dur_ns;
    int64_t *pid;
    int64_t *tid;
    int64_t *stream;
    int64_t *device;
    int64_t *correlation;
    int64_t *external_id;
    int64_t *bytes;
    int64_t *args_start;       /* byte offsets of the args object in the buffer; -1: none */
    int64_t *args_end;
    uint8_t *ph;
    uint8_t *cat_valid;
    uint8_t *name_valid;
    int32_t *cat_off;
    int32_t *name_off;
    char *cat_data;
    char *name_data;
    int64_t cat_cap;
    int64_t name_cap;
    /* an op's recorded shapes as the importer's attrs JSON, made from the args' own text:
     * 0 none (no "Input Dims"), 1 shapes_data[shapes_off[row]:shapes_off[row+1]], 2 text the
     * scanner does not re-serialize exactly (escapes, floats, objects): decode it in Python */
    uint8_t *shapes_state;
    int32_t *shapes_off;
    char *shapes_data;
    int64_t shapes_cap;
};
struct cp_kineto_scan {
    int64_t pos;               /* in/out: where the next event (or separator) starts */
    int need_comma;            /* in/out: an event was just read */
    int64_t rows_in_array;     /* in/out: elements seen so far */
    int64_t skipped;           /* in/out: elements that are not complete events */
    int64_t bad_time;          /* in/out: of those, "X" events whose ts or dur is not a number */
    int64_t too_long;          /* in/out: of those, events whose name or cat outgrew the buffers */
    int64_t min_headroom;      /* in: stop (FULL) when less name space than this is left */
    int status;                /* out: CP_KINETO_* */
    const char *error;         /* out, for CP_KINETO_ERROR */
    int64_t error_pos;
};
int cp_kineto_events(const char *buf, int64_t len, int eof, struct cp_kineto_cols *cols,
                     struct cp_kineto_scan *scan);
/* The end of the JSON value at pos: 0 (ok, *end), 1 (needs more text), -1 (*error at *end). */
int cp_json_skip(const char *buf, int64_t len, int64_t pos, int eof, int64_t *end,
                 const char **error);

#endif
