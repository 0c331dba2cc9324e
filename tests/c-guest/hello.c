/*
 * A tiervm guest in plain C: static, freestanding, no libc, ring 3.
 *
 * Build (any gcc or clang for x86_64; see docs/guest-abi.md):
 *
 *   cc -std=c11 -O2 -ffreestanding -fno-builtin -fno-pie -no-pie -static \
 *      -nostdlib -fno-stack-protector -fno-asynchronous-unwind-tables \
 *      -fcf-protection=none -Wl,--build-id=none -I guest-images/include \
 *      -T tests/c-guest/link.ld -o hello.elf tests/c-guest/hello.c
 *   tiervm run ./hello.elf --duration 0 --vcpus 2 --arg pages=256
 *
 * What it does, per vCPU: checks the boot info, takes `pages` 4 KiB pages of
 * the heap (its own slice), and for `rounds` rounds (0 = until the VMM asks it
 * to stop) fills every 8-byte word with a value derived from the seed and the
 * word's position, reads them back and sums them. It counts one operation per
 * page in its status slot. vCPU 0 waits for every vCPU's phase to reach DONE,
 * publishes metrics (c_checksum, c_mismatches, c_pages, c_rounds, c_vcpus)
 * and exits with `--arg exit=N` (default 0), or with EXIT_MISMATCH if a word
 * read back differs from what was written.
 *
 * tests/c_guest.rs builds this file and checks the report against a checksum
 * it computes independently.
 */
#include "tiervm.h"

#define PAGE_BYTES 4096u
#define WORDS_PER_PAGE (PAGE_BYTES / 8u)

/* Exit codes for failures (the test checks for these). */
#define EXIT_BAD_BOOT_INFO 0xB007u
#define EXIT_HEAP_TOO_SMALL 0xB008u
#define EXIT_MISMATCH 0xBADu

/* gcc and clang may turn loops into calls to these even when freestanding. */
void *memset(void *dst, int c, size_t n)
{
    volatile unsigned char *d = dst;
    while (n--)
        *d++ = (unsigned char)c;
    return dst;
}

void *memcpy(void *dst, const void *src, size_t n)
{
    volatile unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--)
        *d++ = *s++;
    return dst;
}

/* splitmix64's finaliser over (seed, position): the value stored in one word.
   The seed is multiplied first so that no seed change just permutes words. */
static uint64_t word_value(uint64_t seed, uint64_t vcpu, uint64_t page, uint64_t word,
                           uint64_t round)
{
    uint64_t z = seed * 0xD1342543DE82EF95ULL;
    z ^= (vcpu << 48) ^ (round << 40) ^ (page << 12) ^ word;
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Parses a decimal --arg value; `fallback` if absent or malformed. */
static uint64_t arg_u64(const struct tiervm_boot_info *boot, const char *key, uint64_t fallback)
{
    const char *v = tiervm_arg(boot, key);
    uint64_t x = 0;
    size_t i = 0;
    if (!v || v[0] == '\0')
        return fallback;
    for (; i < TIERVM_ARG_VALUE_LEN && v[i] != '\0'; i++) {
        if (v[i] < '0' || v[i] > '9' || x > (UINT64_MAX - 9) / 10)
            return fallback;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    return x;
}

static void put_u64(uint64_t v)
{
    char buf[21];
    int n = 0;
    do {
        buf[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        tiervm_putc(buf[--n]);
}

static void put_hex(uint64_t v)
{
    tiervm_puts("0x");
    for (int shift = 60; shift >= 0; shift -= 4)
        tiervm_putc("0123456789abcdef"[(v >> shift) & 0xf]);
}

/* Per-vCPU results, shared through guest memory (.bss). */
static volatile uint64_t checksums[TIERVM_MAX_VCPUS];
static volatile uint64_t mismatches[TIERVM_MAX_VCPUS];
static volatile uint64_t rounds_done[TIERVM_MAX_VCPUS];

__attribute__((noreturn, used)) void c_main(uint64_t vcpu, const struct tiervm_boot_info *boot)
{
    if (boot != tiervm_boot_info() || boot->magic != TIERVM_BOOT_MAGIC ||
        boot->abi_version != TIERVM_ABI_VERSION || boot->status_gpa != TIERVM_STATUS_GPA ||
        boot->vcpu_count == 0 || boot->vcpu_count > TIERVM_MAX_VCPUS ||
        vcpu >= boot->vcpu_count || boot->heap_start > boot->heap_end ||
        boot->heap_end > boot->ram_size)
        tiervm_exit(EXIT_BAD_BOOT_INFO);

    uint32_t me = (uint32_t)vcpu;
    uint64_t pages = arg_u64(boot, "pages", 64);
    uint64_t rounds = arg_u64(boot, "rounds", 1);
    uint64_t slice = pages * PAGE_BYTES;
    if (pages == 0 || pages > (boot->heap_end - boot->heap_start) / PAGE_BYTES / boot->vcpu_count)
        tiervm_exit(EXIT_HEAP_TOO_SMALL);
    volatile uint64_t *mem = (volatile uint64_t *)(uintptr_t)(boot->heap_start + me * slice);

    tiervm_set_phase(me, TIERVM_PHASE_INIT);
    if (me == 0) {
        tiervm_puts("hello from a C guest: ");
        put_u64(boot->vcpu_count);
        tiervm_puts(" vCPU(s), seed ");
        put_u64(boot->seed);
        tiervm_puts(", heap ");
        put_hex(boot->heap_start);
        tiervm_puts("..");
        put_hex(boot->heap_end);
        tiervm_puts("\n");
    }

    tiervm_set_phase(me, TIERVM_PHASE_RUN);
    uint64_t sum = 0, bad = 0, ops = 0, r = 0;
    for (; rounds == 0 || r < rounds; r++) {
        if (tiervm_stop_requested())
            break;
        for (uint64_t p = 0; p < pages; p++) {
            volatile uint64_t *page = mem + p * WORDS_PER_PAGE;
            for (uint64_t w = 0; w < WORDS_PER_PAGE; w++)
                page[w] = word_value(boot->seed, me, p, w, r);
            for (uint64_t w = 0; w < WORDS_PER_PAGE; w++) {
                uint64_t v = page[w];
                bad += v != word_value(boot->seed, me, p, w, r);
                sum += v;
            }
            tiervm_set_ops(me, ++ops);
        }
        tiervm_status()->vcpus[me].heartbeat = r + 1;
    }
    checksums[me] = sum;
    mismatches[me] = bad;
    rounds_done[me] = r;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    tiervm_set_phase(me, TIERVM_PHASE_DONE);
    if (me != 0)
        tiervm_exit(bad ? EXIT_MISMATCH : 0);

    /* vCPU 0: wait until every vCPU has published its results. */
    for (uint32_t i = 1; i < boot->vcpu_count; i++)
        while (tiervm_status()->vcpus[i].phase != TIERVM_PHASE_DONE)
            __builtin_ia32_pause();
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint64_t total = 0, total_bad = 0, min_rounds = UINT64_MAX;
    for (uint32_t i = 0; i < boot->vcpu_count; i++) {
        total += checksums[i];
        total_bad += mismatches[i];
        if (rounds_done[i] < min_rounds)
            min_rounds = rounds_done[i];
    }
    /* A double holds 52 bits exactly. */
    tiervm_publish_metric("c_checksum", (double)(total & ((1ULL << 52) - 1)));
    tiervm_publish_metric("c_mismatches", (double)total_bad);
    tiervm_publish_metric("c_pages", (double)(pages * boot->vcpu_count));
    tiervm_publish_metric("c_rounds", (double)min_rounds);
    tiervm_publish_metric("c_vcpus", (double)boot->vcpu_count);
    tiervm_puts("C guest done: checksum ");
    put_hex(total);
    tiervm_puts("\n");
    tiervm_exit(total_bad ? EXIT_MISMATCH : (uint32_t)arg_u64(boot, "exit", 0));
}

TIERVM_DEFINE_START(c_main);
