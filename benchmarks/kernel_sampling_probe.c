/* Kernel-side interval sampling, probed: what issue 14's way below perf stat's cost would cost.
 *
 *   kernel_sampling_probe MODE INTERVAL_NS -- COMMAND...
 *
 * MODE kernel: one group per CPU on the launched command (pid = child, cpu = each, inherit),
 * a task-clock leader sampling every INTERVAL_NS of the task's CPU time with
 * PERF_SAMPLE_READ | PERF_SAMPLE_TID | PERF_SAMPLE_TIME and PERF_FORMAT_GROUP (inherit with
 * SAMPLE_READ needs Linux 6.12: each sample then carries the sampled thread's own counts), a
 * page-faults member; the kernel writes the samples into each CPU's mmap ring and this process
 * only drains the rings twice a second. MODE tick: the same group (no sampling) read by a
 * thread woken every INTERVAL_NS, as counterprof's sampler and perf stat -I do.
 *
 * Prints one line of key=value: this process's CPU (getrusage SELF), the command's CPU
 * (RUSAGE_CHILDREN), samples or ticks taken, records lost, and the task-clock total summed from
 * the samples' last value per thread against the leader's final read (what a reader of the
 * rings alone would miss: each thread's counts after its last sample).
 * A benchmark probe compiled by tests/bench/kernel_sampling.py, not part of the package.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RING_PAGES 64               /* data pages per CPU: 256 KiB, ~6500 samples of 40 bytes */
#define MAX_CPUS 256
#define SLOTS 65536                 /* (cpu, tid) pairs remembered: open addressing */

static long page_size;
static int ncpu;
static int leader[MAX_CPUS], member[MAX_CPUS];
static void *ring[MAX_CPUS];
static uint64_t samples, lost;
/* each thread's task-clock at its last sample, per CPU: a thread has one inherited event per
 * CPU's group, and a sample carries the counts of the one on the CPU it ran on */
static struct { uint32_t key; uint64_t clock; } last[SLOTS];

static void remember(int cpu, uint32_t tid, uint64_t clock) {
    uint32_t key = ((uint32_t)cpu << 24 | tid) + 1, h = key * 2654435761u % SLOTS;
    while (last[h].key != 0 && last[h].key != key) h = (h + 1) % SLOTS;
    last[h].key = key;
    last[h].clock = clock;
}

static int perf_open(struct perf_event_attr *a, pid_t pid, int cpu, int group) {
    return (int)syscall(SYS_perf_event_open, a, pid, cpu, group, PERF_FLAG_FD_CLOEXEC);
}

static void open_group(int i, pid_t pid, int cpu, int64_t period_ns, int sampling) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.read_format = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
    a.disabled = 1;
    a.enable_on_exec = 1;
    a.inherit = 1;
    a.exclude_kernel = 0;
    if (sampling) {
        a.sample_period = (uint64_t)period_ns;
        a.sample_type = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_READ;
    }
    leader[i] = perf_open(&a, pid, cpu, -1);
    if (leader[i] < 0) { fprintf(stderr, "leader cpu %d: %s\n", cpu, strerror(errno)); exit(2); }
    struct perf_event_attr m;
    memset(&m, 0, sizeof m);
    m.size = sizeof m;
    m.type = PERF_TYPE_SOFTWARE;
    m.config = PERF_COUNT_SW_PAGE_FAULTS;
    m.read_format = a.read_format;
    m.inherit = 1;
    m.enable_on_exec = 1;
    m.disabled = 1;
    member[i] = perf_open(&m, pid, cpu, leader[i]);
    if (member[i] < 0) { fprintf(stderr, "member cpu %d: %s\n", cpu, strerror(errno)); exit(2); }
    if (sampling) {
        ring[i] = mmap(NULL, (size_t)(RING_PAGES + 1) * page_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                       leader[i], 0);
        if (ring[i] == MAP_FAILED) { fprintf(stderr, "mmap cpu %d: %s\n", cpu, strerror(errno)); exit(2); }
    }
}

/* A sample: header, pid, tid, time, then the group read {nr, enabled, running, values[nr]}. */
static void drain(int i) {
    struct perf_event_mmap_page *meta = ring[i];
    char *data = (char *)ring[i] + page_size;
    uint64_t size = (uint64_t)RING_PAGES * page_size;
    uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
    uint64_t tail = meta->data_tail;
    while (tail < head) {
        struct perf_event_header h;
        char rec[512];
        for (size_t k = 0; k < sizeof h; k++) ((char *)&h)[k] = data[(tail + k) % size];
        if (h.size > sizeof rec || h.size < sizeof h) break;
        for (size_t k = 0; k < h.size; k++) rec[k] = data[(tail + k) % size];
        if (h.type == PERF_RECORD_SAMPLE) {
            uint32_t *ids = (uint32_t *)(rec + sizeof h);
            uint64_t *words = (uint64_t *)(rec + sizeof h + 8);   /* time, nr, enabled, running, v0, v1 */
            uint32_t tid = ids[1];
            samples++;
            remember(i, tid, words[4]);
        } else if (h.type == PERF_RECORD_LOST) {
            lost += ((uint64_t *)(rec + sizeof h))[1];
        }
        tail += h.size;
    }
    __atomic_store_n(&meta->data_tail, tail, __ATOMIC_RELEASE);
}

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 5 || strcmp(argv[3], "--") != 0) {
        fprintf(stderr, "usage: %s kernel|tick INTERVAL_NS -- COMMAND...\n", argv[0]);
        return 2;
    }
    int kernel = strcmp(argv[1], "kernel") == 0;
    int64_t period = atoll(argv[2]);
    page_size = sysconf(_SC_PAGESIZE);
    ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int go[2];
    if (pipe(go) < 0) return 2;
    pid_t child = fork();
    if (child == 0) {
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) != 1) _exit(127);
        execvp(argv[4], argv + 4);
        _exit(127);
    }
    close(go[0]);
    int groups = kernel ? ncpu : 1;
    for (int i = 0; i < groups; i++) open_group(i, child, kernel ? i : -1, period, kernel);
    if (write(go[1], "x", 1) != 1) return 2;
    close(go[1]);
    uint64_t ticks = 0;
    int status = 0;
    int64_t next = mono_ns();
    int64_t wake = kernel ? 500000000LL : period;
    for (;;) {
        next += wake;
        struct timespec ts = {next / 1000000000LL, next % 1000000000LL};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        if (kernel) {
            for (int i = 0; i < groups; i++) drain(i);
        } else {
            uint64_t words[8];
            if (read(leader[0], words, sizeof words) > 0) ticks++;
        }
        if (waitpid(child, &status, WNOHANG) == child) break;
    }
    uint64_t total_clock = 0;
    for (int i = 0; i < groups; i++) {
        uint64_t words[8];
        if (kernel) drain(i);
        if (read(leader[i], words, sizeof words) > 0) total_clock += words[3];
    }
    uint64_t sampled_clock = 0;
    for (int h = 0; h < SLOTS; h++) sampled_clock += last[h].clock;
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    printf("mode=%s interval_ns=%lld self_cpu_s=%.6f child_cpu_s=%.6f samples=%llu ticks=%llu lost=%llu "
           "task_clock_s=%.6f sampled_task_clock_s=%.6f exit=%d\n",
           argv[1], (long long)period,
           self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6 + self.ru_stime.tv_sec + self.ru_stime.tv_usec / 1e6,
           kids.ru_utime.tv_sec + kids.ru_utime.tv_usec / 1e6 + kids.ru_stime.tv_sec + kids.ru_stime.tv_usec / 1e6,
           (unsigned long long)samples, (unsigned long long)ticks, (unsigned long long)lost,
           total_clock / 1e9, sampled_clock / 1e9, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
