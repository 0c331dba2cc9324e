/*
 * tiervm.h: the tiervm guest ABI for guests written in C (or anything that
 * can read a C header).
 *
 * This is a transcription of guest-images/src/abi.rs, the single source of
 * truth that the VMM compiles against; docs/guest-abi.md explains it. The test
 * `c_guest` (tests/c_guest.rs) compiles this header with the system C
 * compiler and compares every constant, size and field offset below with the
 * Rust definitions, so the two cannot drift apart.
 *
 * A guest is a static, non-PIE x86_64 ELF loaded at or above
 * TIERVM_IMAGE_BASE_GPA with virtual address == physical address. It runs in
 * 64-bit ring 3 with IOPL 3 (so `in`/`out` work), no IDT (any exception is a
 * triple fault the VMM reports as a crash), and no interrupts. At the entry
 * point: rdi = vCPU index, rsi = TIERVM_BOOT_INFO_GPA, rsp = top of this
 * vCPU's stack. `hlt` faults in ring 3: end a vCPU with tiervm_exit().
 *
 * Example: tests/c-guest/hello.c (built with tests/c-guest/link.ld).
 *
 * Everything in this file is freestanding C11 (gcc or clang); the helpers
 * at the end use GNU inline assembly. Define TIERVM_NO_HELPERS to get only
 * the layout and constants.
 */
#ifndef TIERVM_H
#define TIERVM_H

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------------- */
/* Constants                                                              */
/* ---------------------------------------------------------------------- */

/* tiervm_boot_info.magic: "TIERVM01" read as a little-endian u64. */
#define TIERVM_BOOT_MAGIC 0x31304d5652454954ULL
/* tiervm_status_page.magic: "TVSTATUS" read as a little-endian u64. */
#define TIERVM_STATUS_MAGIC 0x5355544154535654ULL
/* tiervm_boot_info.abi_version; bumped on any incompatible change. */
#define TIERVM_ABI_VERSION 1u

/* Guest-physical (= virtual) addresses. */
#define TIERVM_BOOT_INFO_GPA 0x1000ULL     /* struct tiervm_boot_info, read-only */
#define TIERVM_STATUS_GPA 0x4000ULL        /* struct tiervm_status_page */
#define TIERVM_STATUS_SIZE 0x4000ULL       /* bytes reserved for the status page */
#define TIERVM_PAGE_TABLES_GPA 0x100000ULL /* page tables built by the VMM */
#define TIERVM_IMAGE_BASE_GPA 0x400000ULL  /* lowest address an image may load at */
#define TIERVM_STACK_SIZE 0x40000ULL       /* stack bytes per vCPU (256 KiB) */
#define TIERVM_PAGE_SIZE 0x1000ULL          /* bytes in a base page (4 KiB) */
#define TIERVM_GUEST_LARGE_PAGE 0x200000ULL /* RAM is mapped with 2 MiB pages */

/* Array bounds. */
#define TIERVM_MAX_VCPUS 64
#define TIERVM_MAX_ARGS 32
#define TIERVM_ARG_KEY_LEN 24
#define TIERVM_ARG_VALUE_LEN 40
#define TIERVM_MAX_METRICS 64
#define TIERVM_METRIC_NAME_LEN 24

/* I/O ports. */
/* out (1-4 bytes): this vCPU is finished, the value is its exit code. The VM
   ends when every vCPU has exited; the VM's exit code is vCPU 0's. */
#define TIERVM_PORT_EXIT 0x501
/* out (any value): "first guest instruction reached", for boot_ms. */
#define TIERVM_PORT_BOOTED 0x502
/* COM1, a 16550 UART: out bytes to the data register appear on the host's
   stderr as "[guest] " lines (printable ASCII, capped at 1 MiB per run). */
#define TIERVM_PORT_SERIAL 0x3f8

/* Latency emulation (--emulate-latency; docs/emulation.md). */
/* tiervm_emulation_header.magic: "TVEMUL01" read as a little-endian u64. */
#define TIERVM_EMULATION_MAGIC 0x31304c554d455654ULL
#define TIERVM_EMULATION_VERSION 1u
#define TIERVM_EMULATION_MAX_TIERS 4         /* the tier map has 2 bits per page */
#define TIERVM_TIER_MAP_PAGES_PER_WORD 32    /* guest pages per u64 of the tier map */
#define TIERVM_EMULATION_HEADER_SIZE 0x4000ULL /* bytes reserved for the header */
#define TIERVM_CACHE_MODEL_WAYS 4            /* ways per u64 set of the cache model */
#define TIERVM_CACHE_LINE 64                 /* bytes charged as one access */
/* tiervm_emulation_header.guest_state values. */
#define TIERVM_EMU_GUEST_IDLE 0u
#define TIERVM_EMU_GUEST_MEASURING 1u
#define TIERVM_EMU_GUEST_CHARGING 2u

/* tiervm_vcpu_status.phase values. */
#define TIERVM_PHASE_BOOT 0u   /* entered, not yet set up */
#define TIERVM_PHASE_INIT 1u   /* building the data set (not counted) */
#define TIERVM_PHASE_RUN 2u    /* running the measured workload */
#define TIERVM_PHASE_VERIFY 3u /* verifying results */
#define TIERVM_PHASE_DONE 4u   /* finished; about to exit */

/* ---------------------------------------------------------------------- */
/* Layout (all little-endian, no implicit padding)                        */
/* ---------------------------------------------------------------------- */

/* One --arg key=value, both NUL-padded UTF-8 (not NUL-terminated when full). */
struct tiervm_arg {
    char key[TIERVM_ARG_KEY_LEN];     /* offset 0 */
    char value[TIERVM_ARG_VALUE_LEN]; /* offset 24 */
};

/* At TIERVM_BOOT_INFO_GPA; written by the VMM before any vCPU runs. */
struct tiervm_boot_info {
    uint64_t magic;       /* offset 0: TIERVM_BOOT_MAGIC */
    uint32_t abi_version; /* offset 8: TIERVM_ABI_VERSION */
    uint32_t vcpu_count;  /* offset 12: vCPUs running this image */
    uint64_t ram_size;    /* offset 16: RAM spans GPA 0..ram_size */
    uint64_t tsc_khz;     /* offset 24: TSC frequency, for rdtsc deltas */
    uint64_t seed;        /* offset 32: --seed */
    uint64_t heap_start;  /* offset 40: first free byte (2 MiB aligned) */
    uint64_t heap_end;    /* offset 48: one past the last free byte */
    uint64_t status_gpa;  /* offset 56: TIERVM_STATUS_GPA */
    uint32_t arg_count;   /* offset 64: valid entries in args */
    uint32_t reserved;    /* offset 68: zero */
    struct tiervm_arg args[TIERVM_MAX_ARGS]; /* offset 72 */
    /* offset 2120: GPA of the latency-emulation region (its header first),
       0 without --emulate-latency. A guest may ignore it: it then runs
       uncharged. (Added within ABI version 1; older VMMs leave it 0.) */
    uint64_t emulation_gpa;
};

/* One per vCPU in the status page: one cache line, written only by its vCPU. */
struct tiervm_vcpu_status {
    uint64_t ops;       /* offset 0: operations completed (monotonic) */
    uint64_t phase;     /* offset 8: TIERVM_PHASE_* */
    uint64_t heartbeat; /* offset 16: free for the guest's use */
    uint64_t pad[5];    /* offset 24: to 64 bytes */
};

/* One result the guest publishes before exiting. */
struct tiervm_metric {
    char name[TIERVM_METRIC_NAME_LEN]; /* offset 0: [A-Za-z0-9_.-]+, NUL padded */
    uint64_t value_bits;               /* offset 24: a double's bits (finite) */
};

/* At TIERVM_STATUS_GPA. The VMM writes magic and stop_request; the guest
   writes the rest with plain stores (no VM exit). The VMM samples it every
   --sample-ms and trusts nothing in it: it clamps metric_count, drops metrics
   with bad names or non-finite values, and saturates sums. */
struct tiervm_status_page {
    uint64_t magic;        /* offset 0: TIERVM_STATUS_MAGIC (VMM) */
    uint64_t stop_request; /* offset 8: VMM writes 1 at --duration: finish and exit */
    uint64_t metric_count; /* offset 16: valid entries in metrics (guest) */
    uint64_t reserved[5];  /* offset 24 */
    struct tiervm_vcpu_status vcpus[TIERVM_MAX_VCPUS]; /* offset 64 */
    struct tiervm_metric metrics[TIERVM_MAX_METRICS];  /* offset 4160 */
};

/* Latency emulation: one vCPU's counters (two cache lines, written only by
   that vCPU, read by the VMM every ~10 ms; untrusted for the VMM). */
struct tiervm_emulation_vcpu {
    uint64_t accesses[TIERVM_EMULATION_MAX_TIERS]; /* offset 0: charged accesses per tier */
    uint64_t writes[TIERVM_EMULATION_MAX_TIERS];   /* offset 32: of which writes */
    uint64_t cache_hits;     /* offset 64: cache-model hits (not charged) */
    uint64_t charged_cycles; /* offset 72: emulated latency charged, TSC cycles */
    uint64_t paid_cycles;    /* offset 80: TSC cycles spent paying it */
    uint64_t payments;       /* offset 88: payments */
    uint64_t preempted_cycles; /* offset 96: host preemption during payments (not paid) */
    uint64_t host_cache_hits; /* offset 104: charged accesses the host LLC model says hit */
    uint64_t reserved[2];    /* offset 112 */
};

/* At boot_info.emulation_gpa. The tier map at tier_map_gpa has 2 bits per
   guest page p (bits 2*(p%32) of u64 word p/32): the tier the page is on,
   written by the VMM before a placement change becomes visible. A guest
   charges an access that misses its cache model
   max(0, loaded_ps[tier] - host DRAM latency) (see docs/emulation.md). */
struct tiervm_emulation_header {
    uint64_t magic;              /* offset 0: TIERVM_EMULATION_MAGIC (VMM) */
    uint32_t version;            /* offset 8: TIERVM_EMULATION_VERSION (VMM) */
    uint32_t tier_count;         /* offset 12: 1..TIERVM_EMULATION_MAX_TIERS (VMM) */
    uint64_t tier_map_gpa;       /* offset 16 (VMM) */
    uint64_t tier_map_pages;     /* offset 24: guest RAM pages the map covers (VMM) */
    uint64_t unloaded_ps[TIERVM_EMULATION_MAX_TIERS]; /* offset 32 (VMM) */
    uint64_t loaded_ps[TIERVM_EMULATION_MAX_TIERS];   /* offset 64: every ~10 ms (VMM) */
    uint64_t loaded_generation;  /* offset 96: bumped after loaded_ps changes (VMM) */
    uint64_t pay_threshold_ps;   /* offset 104: pay the debt past this (VMM) */
    uint64_t cache_bytes;        /* offset 112: modeled cache per vCPU, 0 = none (VMM) */
    uint64_t cache_model_gpa;    /* offset 120: per-vCPU model arrays, zeroed (VMM) */
    uint64_t cache_model_stride; /* offset 128: bytes per vCPU's array (VMM) */
    uint64_t chase_gpa;          /* offset 136: boot measurement buffer (VMM) */
    uint64_t chase_bytes;        /* offset 144 (VMM) */
    uint64_t dram_ps;            /* offset 152: measured host DRAM latency (guest) */
    uint64_t guest_state;        /* offset 160: TIERVM_EMU_GUEST_* (guest) */
    uint64_t chase_hops;         /* offset 168: loads the measurement timed (guest) */
    uint64_t dram_fixed_ps;      /* offset 176: charge against this, do not measure (VMM) */
    uint64_t access_sample_period; /* offset 184: 0 or 1: charge every access; above 1: set sampling alone (sampled model) or one access in this many (VMM) */
    uint64_t host_cache_bytes;   /* offset 192: host LLC to model besides a smaller cache model, 0 = none (VMM) */
    uint64_t host_cache_model_gpa;    /* offset 200: per-vCPU host LLC models, zeroed (VMM) */
    uint64_t host_cache_model_stride; /* offset 208: bytes per vCPU's host model (VMM) */
    uint64_t llc_hit_ps;         /* offset 216: measured host LLC hit latency (guest) */
    uint64_t ab_phase_ops;       /* offset 224: switch charging on/off every this many ops, 0 = never (VMM) */
    uint64_t reserved[3];        /* offset 232 */
    struct tiervm_emulation_vcpu vcpus[TIERVM_MAX_VCPUS]; /* offset 256 (guest) */
};

#define TIERVM_STATUS_STOP_OFFSET 8
#define TIERVM_STATUS_VCPUS_OFFSET 64

/* The layout above, checked at compile time wherever this header is used. */
_Static_assert(sizeof(struct tiervm_arg) == 64, "tiervm_arg layout");
_Static_assert(offsetof(struct tiervm_boot_info, args) == 72, "tiervm_boot_info layout");
_Static_assert(offsetof(struct tiervm_boot_info, emulation_gpa) == 2120, "tiervm_boot_info layout");
_Static_assert(sizeof(struct tiervm_boot_info) == 2128, "tiervm_boot_info layout");
_Static_assert(sizeof(struct tiervm_emulation_vcpu) == 128, "tiervm_emulation_vcpu layout");
_Static_assert(offsetof(struct tiervm_emulation_header, vcpus) == 256,
               "tiervm_emulation_header layout");
_Static_assert(sizeof(struct tiervm_emulation_header) <= TIERVM_EMULATION_HEADER_SIZE,
               "emulation header fits");
_Static_assert(sizeof(struct tiervm_vcpu_status) == 64, "tiervm_vcpu_status layout");
_Static_assert(sizeof(struct tiervm_metric) == 32, "tiervm_metric layout");
_Static_assert(offsetof(struct tiervm_status_page, stop_request) == TIERVM_STATUS_STOP_OFFSET,
               "tiervm_status_page layout");
_Static_assert(offsetof(struct tiervm_status_page, vcpus) == TIERVM_STATUS_VCPUS_OFFSET,
               "tiervm_status_page layout");
_Static_assert(offsetof(struct tiervm_status_page, metrics) == 4160, "tiervm_status_page layout");
_Static_assert(sizeof(struct tiervm_status_page) == 6208, "tiervm_status_page layout");
_Static_assert(sizeof(struct tiervm_status_page) <= TIERVM_STATUS_SIZE, "status page fits");

/* ---------------------------------------------------------------------- */
/* Helpers (GNU C; ring 3 with IOPL 3)                                    */
/* ---------------------------------------------------------------------- */
#ifndef TIERVM_NO_HELPERS

/* Defines the ELF entry point `_start`: reports "booted", aligns the stack
   and calls `void fn(uint64_t vcpu, const struct tiervm_boot_info *boot)`,
   which must not return (end it with tiervm_exit()). Use once, at file scope. */
#define TIERVM_DEFINE_START(fn)                                                \
    __asm__(".section .text._start,\"ax\",@progbits\n"                         \
            ".globl _start\n"                                                  \
            "_start:\n"                                                        \
            "    mov $0x502, %dx\n" /* TIERVM_PORT_BOOTED */                    \
            "    out %al, %dx\n"                                               \
            "    and $-16, %rsp\n"                                             \
            "    call " #fn "\n"                                               \
            "    ud2\n"                                                        \
            ".previous\n")

static inline void tiervm_outb(uint16_t port, uint8_t value)
{
    __asm__ volatile("outb %0, %1" : : "a"(value), "Nd"(port));
}

static inline void tiervm_outl(uint16_t port, uint32_t value)
{
    __asm__ volatile("outl %0, %1" : : "a"(value), "Nd"(port));
}

static inline uint64_t tiervm_rdtsc(void)
{
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}

/* Ends this vCPU with `code`. */
static inline __attribute__((noreturn)) void tiervm_exit(uint32_t code)
{
    for (;;)
        tiervm_outl(TIERVM_PORT_EXIT, code);
}

static inline void tiervm_putc(char c)
{
    tiervm_outb(TIERVM_PORT_SERIAL, (uint8_t)c);
}

static inline void tiervm_puts(const char *s)
{
    while (*s)
        tiervm_putc(*s++);
}

static inline const struct tiervm_boot_info *tiervm_boot_info(void)
{
    return (const struct tiervm_boot_info *)(uintptr_t)TIERVM_BOOT_INFO_GPA;
}

/* The latency-emulation header, or NULL without --emulate-latency. */
static inline volatile struct tiervm_emulation_header *tiervm_emulation(void)
{
    uint64_t gpa = tiervm_boot_info()->emulation_gpa;
    volatile struct tiervm_emulation_header *h =
        (volatile struct tiervm_emulation_header *)(uintptr_t)gpa;
    if (gpa == 0 || h->magic != TIERVM_EMULATION_MAGIC || h->version != TIERVM_EMULATION_VERSION)
        return NULL;
    return h;
}

/* The tier (0 = fastest) the VMM's map gives the page holding `addr`. */
static inline unsigned tiervm_tier_of(volatile struct tiervm_emulation_header *h, uint64_t addr)
{
    uint64_t page = addr >> 12;
    if (page >= h->tier_map_pages)
        return 0;
    volatile uint64_t *map = (volatile uint64_t *)(uintptr_t)h->tier_map_gpa;
    return (unsigned)((map[page / TIERVM_TIER_MAP_PAGES_PER_WORD] >>
                       ((page % TIERVM_TIER_MAP_PAGES_PER_WORD) * 2)) & 3);
}

/* The status page; volatile because the VMM reads and writes it concurrently. */
static inline volatile struct tiervm_status_page *tiervm_status(void)
{
    return (volatile struct tiervm_status_page *)(uintptr_t)TIERVM_STATUS_GPA;
}

/* Non-zero once the VMM asks the guest to stop (--duration ended). */
static inline int tiervm_stop_requested(void)
{
    return tiervm_status()->stop_request != 0;
}

static inline void tiervm_set_ops(uint32_t vcpu, uint64_t ops)
{
    if (vcpu < TIERVM_MAX_VCPUS)
        tiervm_status()->vcpus[vcpu].ops = ops;
}

static inline void tiervm_set_phase(uint32_t vcpu, uint64_t phase)
{
    if (vcpu < TIERVM_MAX_VCPUS)
        tiervm_status()->vcpus[vcpu].phase = phase;
}

/* Appends a metric (name: [A-Za-z0-9_.-]+, at most TIERVM_METRIC_NAME_LEN
   bytes; value finite). Not thread-safe: call it from one vCPU. Returns 0 on
   success, -1 if the name is too long or the table is full. */
static inline int tiervm_publish_metric(const char *name, double value)
{
    volatile struct tiervm_status_page *st = tiervm_status();
    uint64_t i = st->metric_count;
    union {
        double d;
        uint64_t u;
    } bits;
    size_t n = 0;
    if (i >= TIERVM_MAX_METRICS)
        return -1;
    while (name[n] != '\0') {
        if (n == TIERVM_METRIC_NAME_LEN)
            return -1;
        n++;
    }
    for (size_t k = 0; k < TIERVM_METRIC_NAME_LEN; k++)
        st->metrics[i].name[k] = k < n ? name[k] : '\0';
    bits.d = value;
    st->metrics[i].value_bits = bits.u;
    st->metric_count = i + 1;
    return 0;
}

/* The value of `--arg key=...` as a NUL-padded buffer of
   TIERVM_ARG_VALUE_LEN bytes (not NUL-terminated when full), or NULL if the
   key was not given. The last occurrence wins. */
static inline const char *tiervm_arg(const struct tiervm_boot_info *boot, const char *key)
{
    uint32_t count = boot->arg_count < TIERVM_MAX_ARGS ? boot->arg_count : TIERVM_MAX_ARGS;
    const char *found = NULL;
    for (uint32_t a = 0; a < count; a++) {
        const char *k = boot->args[a].key;
        size_t i = 0;
        while (i < TIERVM_ARG_KEY_LEN && key[i] != '\0' && k[i] == key[i])
            i++;
        if (key[i] == '\0' && (i == TIERVM_ARG_KEY_LEN || k[i] == '\0'))
            found = boot->args[a].value;
    }
    return found;
}

#endif /* TIERVM_NO_HELPERS */

#endif /* TIERVM_H */
