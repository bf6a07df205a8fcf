/* Kernel-side interval sampling (kernel_sampler.c): the perf collector's `sampling: kernel`.
 * Errors are -errno, as in counterprof_native.h. */
#ifndef COUNTERPROF_KERNEL_SAMPLER_H
#define COUNTERPROF_KERNEL_SAMPLER_H

#include "counterprof_native.h"

/* perf_event_open of spec on CLOCK_MONOTONIC (a group's members too); sample_period_ns > 0 makes it a sampling leader: every that many ns
 * of task-clock, a PERF_SAMPLE_TID | TIME | READ record (times on CLOCK_MONOTONIC). */
int cp_ks_event_open(const struct cp_event_spec *spec, int pid, int cpu, int group_fd,
                     int64_t sample_period_ns);

typedef struct cp_ks cp_ks;

struct cp_ks_stats {
    uint64_t samples;        /* sample records read from the rings */
    uint64_t lost;           /* records the kernel dropped (PERF_RECORD_LOST): the next sample of
                              * the same thread carries their counts, only their times are lost */
    uint64_t late_samples;   /* stamped in a bucket already drained: counted in the next one */
    uint64_t bad_records;
    uint64_t dropped;        /* samples not counted (out of memory) */
    uint64_t read_errors;    /* failed final group reads */
    uint64_t rows;
    uint64_t threads;        /* (group, tid) pairs seen */
};

/* nslots output series, buckets of interval_ns, ring_pages (a power of two) per group's ring. */
cp_ks *cp_ks_new(int nslots, int64_t interval_ns, int ring_pages, int *err);
/* A group whose leader was opened by cp_ks_event_open with a period: mmaps its ring.
 * member_slots[m]: member m's output slot, -1 for one not reported (a timing leader). */
int cp_ks_add_group(cp_ks *k, int leader_fd, int nmembers, const int32_t *member_slots);
/* The grid's origin: now. */
void cp_ks_start(cp_ks *k);
void cp_ks_set_time_offset(cp_ks *k, int64_t offset_ns);
/* Read the rings; the number of rows (whole buckets of nslots) ready to drain. */
int cp_ks_poll(cp_ks *k);
/* Disable, read the rings and the groups' final counts: their rest into the last bucket, which
 * ends now; every bucket is then ready. 0, or the -errno of a failed final read. */
int cp_ks_finish(cp_ks *k);
/* Up to max_records ready rows (whole buckets), as cp_sampler_drain's columns. */
int cp_ks_drain(cp_ks *k, int max_records, int64_t *time_ns, int64_t *duration_ns, int32_t *slot,
                double *value, float *quality, uint8_t *validity);
void cp_ks_get_stats(cp_ks *k, struct cp_ks_stats *out);
/* Unmaps the rings; does not close the fds. */
void cp_ks_free(cp_ks *k);

#endif
