#!/usr/bin/env bash
# A real two-NUMA-node, hardware-virtualization (SVM) host under QEMU, for
# correctness checks that the build hosts (PVM KVM, one node) cannot make.
#
# What it does (docs/two-node-host.md has the details):
#   1. installs qemu-system-x86, busybox-static, cpio, xz-utils and jq from the
#      Debian archive if they are missing (apt-get update first; numactl for
#      migratepages, the node check's negative control), and downloads
#      the newest Debian linux-image-6.12.*-amd64-unsigned package (6.1 lacks
#      UFFDIO_MOVE), cached under target/qemu-host/;
#   2. builds an initramfs: busybox, the kvm modules of that package, the
#      tiervm release binary (+ its shared libraries), jq, and init.sh as /init;
#   3. boots it under TCG with an EPYC CPU (+svm) and two NUMA nodes of 1 GiB,
#      inside a hard timeout; /init runs the checks and prints one line per check:
#        TIERVM-QEMU-CHECK PASS|FAIL <name>: <detail>
#      and then TIERVM-QEMU-DONE passed=N failed=M;
#   4. exits 0 only if the DONE line came, no check failed and every expected
#      check reported; otherwise prints what failed and exits 1.
#
# Usage: tests/qemu-host/run.sh            (after cargo build --release)
# Environment:
#   TIERVM_BIN               the tiervm binary (default target/release/tiervm)
#   TIERVM_REQUIRE_QEMU=1    a host that cannot run the check (no apt-get, not
#                            root, no network) FAILS instead of skipping loudly;
#                            .ci/run sets it
#   TIERVM_QEMU_TIMEOUT      seconds for the whole boot (default 420)
#   TIERVM_QEMU_KEEP_LOG     path to copy the console log to
#   TIERVM_QEMU_INIT         another /init script (experiments by hand); the
#                            same PLAN/CHECK/DONE lines are expected from it
# Exit codes: 0 all checks passed; 1 a check failed or the host could not run
# them under TIERVM_REQUIRE_QEMU=1; 77 not run (loudly) because this host lacks
# what the check needs and TIERVM_REQUIRE_QEMU is not 1.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache="$root/target/qemu-host"
bin=${TIERVM_BIN:-$root/target/release/tiervm}
boot_timeout=${TIERVM_QEMU_TIMEOUT:-420}
require=${TIERVM_REQUIRE_QEMU:-0}
packages=(qemu-system-x86 busybox-static cpio xz-utils jq numactl)

t_start=$(date +%s)
log() { echo "== qemu-host: $*"; }

# A loud banner for a run that cannot happen on this host: FAIL under
# TIERVM_REQUIRE_QEMU=1, otherwise exit 77 (not run) with the reason.
cannot_run() {
  local why="$1"
  {
    echo
    echo "######################################################################"
    echo "## QEMU TWO-NODE SVM HOST CHECK NOT RUN: $why"
    if [ "$require" = 1 ]; then
      echo "## TIERVM_REQUIRE_QEMU=1: this is a FAILURE"
    else
      echo "## (set TIERVM_REQUIRE_QEMU=1 to make this a failure; .ci/run does)"
    fi
    echo "######################################################################"
    echo
  } >&2
  if [ "$require" = 1 ]; then exit 1; fi
  exit 77
}

fail() {
  echo "== qemu-host: FAILED: $*" >&2
  exit 1
}

[ -x "$bin" ] || fail "no tiervm binary at $bin: run cargo build --release first"
mkdir -p "$cache"

# ---------------------------------------------------------------------------
# 1. Packages and the kernel.
# ---------------------------------------------------------------------------
have_tools() {
  command -v qemu-system-x86_64 >/dev/null && [ -x /bin/busybox ] &&
    /bin/busybox --list >/dev/null 2>&1 && command -v cpio >/dev/null &&
    command -v xz >/dev/null && command -v jq >/dev/null && command -v migratepages >/dev/null &&
    command -v dpkg-deb >/dev/null
}

apt_ok=0
if command -v apt-get >/dev/null && command -v apt-cache >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    log "apt-get update"
    if timeout 180 apt-get update -qq >"$cache/apt-update.log" 2>&1; then
      apt_ok=1
    else
      echo "== qemu-host: WARNING: apt-get update failed (see below); using what is installed and cached" >&2
      tail -5 "$cache/apt-update.log" >&2 || true
    fi
  else
    echo "== qemu-host: WARNING: not root: cannot apt-get update/install; using what is installed and cached" >&2
  fi
else
  echo "== qemu-host: WARNING: no apt-get/apt-cache (not a Debian host?)" >&2
fi

if ! have_tools; then
  if [ "$apt_ok" = 1 ]; then
    log "apt-get install ${packages[*]}"
    if ! DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends \
      "${packages[@]}" >"$cache/apt-install.log" 2>&1; then
      tail -20 "$cache/apt-install.log" >&2 || true
      fail "apt-get install ${packages[*]} failed (log: $cache/apt-install.log)"
    fi
    have_tools || fail "installed ${packages[*]} but a tool is still missing"
  else
    cannot_run "missing tools (need ${packages[*]}) and apt-get cannot install them here"
  fi
fi

# The kernel: the newest linux-image-6.12.N+debX-amd64-unsigned in the archive.
kernel_pkg=""
if command -v apt-cache >/dev/null; then
  kernel_pkg=$(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb[0-9]+-amd64-unsigned$' 2>/dev/null |
    awk '{print $1}' | sort -V | tail -1 || true)
fi
if [ -z "$kernel_pkg" ]; then
  # No archive answer (no apt, or no network): use the newest cached one.
  kernel_pkg=$(ls "$cache/kernel" 2>/dev/null | sort -V | tail -1 || true)
  [ -n "$kernel_pkg" ] ||
    cannot_run "the archive offers no linux-image-6.12.*-amd64-unsigned (apt-cache search found none; apt-get update failed?) and none is cached"
  echo "== qemu-host: WARNING: the archive did not answer; using the cached $kernel_pkg" >&2
fi
kdir="$cache/kernel/$kernel_pkg"
if [ ! -f "$kdir/.unpacked" ]; then
  rm -rf "$kdir" && mkdir -p "$kdir"
  log "apt-get download $kernel_pkg"
  if ! (cd "$kdir" && timeout 600 apt-get download -qq "$kernel_pkg") >"$cache/apt-download.log" 2>&1; then
    tail -5 "$cache/apt-download.log" >&2 || true
    rm -rf "$kdir"
    if [ "$apt_ok" = 1 ]; then fail "apt-get download $kernel_pkg failed"; fi
    cannot_run "cannot download $kernel_pkg (apt-get update failed: no network?)"
  fi
  dpkg-deb -x "$kdir"/*.deb "$kdir/x"
  rm -f "$kdir"/*.deb
  touch "$kdir/.unpacked"
fi
kver=$(ls "$kdir/x/lib/modules" | head -1)
vmlinuz="$kdir/x/boot/vmlinuz-$kver"
kconfig="$kdir/x/boot/config-$kver"
[ -f "$vmlinuz" ] || fail "no $vmlinuz in $kernel_pkg"
log "kernel $kernel_pkg ($kver)"
for opt in CONFIG_USERFAULTFD=y CONFIG_NUMA=y CONFIG_KVM_AMD=m; do
  grep -qx "$opt" "$kconfig" || fail "$kernel_pkg: $kconfig lacks $opt"
done

# ---------------------------------------------------------------------------
# 2. The initramfs.
# ---------------------------------------------------------------------------
ir="$cache/initramfs"
rm -rf "$ir"
mkdir -p "$ir"/{bin,sbin,usr/bin,usr/sbin,lib/modules,proc,sys,dev,tmp,etc,root}
cp /bin/busybox "$ir/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ -e "$ir/bin/$applet" ] || ln -s busybox "$ir/bin/$applet"
done
mdir="$kdir/x/lib/modules/$kver/kernel"
for m in virt/lib/irqbypass drivers/crypto/ccp/ccp arch/x86/kvm/kvm arch/x86/kvm/kvm-amd; do
  [ -f "$mdir/$m.ko.xz" ] || fail "$kernel_pkg has no $m.ko.xz"
  xz -dc "$mdir/$m.ko.xz" >"$ir/lib/modules/$(basename "$m").ko"
done
cp "$kconfig" "$ir/etc/kernel-config"

# A binary and the shared libraries (and loader) ldd lists for it.
add_binary() {
  local src="$1" dst="$2"
  mkdir -p "$(dirname "$ir$dst")"
  if command -v objcopy >/dev/null; then
    objcopy --strip-debug "$src" "$ir$dst"
  else
    cp "$src" "$ir$dst"
  fi
  chmod 755 "$ir$dst"
  local lib
  for lib in $(ldd "$src" | grep -o '/[^ ]*' || true); do
    if [ ! -e "$ir$lib" ]; then
      mkdir -p "$(dirname "$ir$lib")"
      cp -L "$lib" "$ir$lib"
    fi
  done
}
add_binary "$bin" /usr/bin/tiervm
add_binary "$(command -v jq)" /usr/bin/jq
add_binary "$(command -v migratepages)" /usr/bin/migratepages
cp "${TIERVM_QEMU_INIT:-$here/init.sh}" "$ir/init"
chmod 755 "$ir/init"
initrd="$cache/initrd.gz"
(cd "$ir" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1 >"$initrd")
log "initramfs $(du -h "$initrd" | cut -f1) ($(ls "$ir/lib/modules" | tr '\n' ' '))"

# ---------------------------------------------------------------------------
# 3. Boot (bounded) and 4. judge the console.
# ---------------------------------------------------------------------------
console="$cache/console.log"
# One TCG thread for both vCPUs (thread=single): with multi-threaded TCG a
# kernel text patch (a static key KVM flips when tiervm creates or destroys
# a vCPU) once left a stale int3 that oopsed the guest kernel. The checks
# are counts and states, never speed, so the slower emulation costs only
# operations per run.
log "booting: TCG (one thread), EPYC+svm, 2 vCPUs, node0 1G (CPUs 0-1) + node1 1G (no CPUs), timeout ${boot_timeout}s"
t_boot=$(date +%s)
set +e
timeout --kill-after=10 "$boot_timeout" qemu-system-x86_64 \
  -accel tcg,thread=single -cpu EPYC,+svm -m 2G -smp 2 \
  -object memory-backend-ram,id=m0,size=1G -object memory-backend-ram,id=m1,size=1G \
  -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,memdev=m1 \
  -numa dist,src=0,dst=1,val=20 \
  -kernel "$vmlinuz" -initrd "$initrd" \
  -append "console=ttyS0 quiet panic=-1 numa_balancing=disable" \
  -nographic -no-reboot -monitor none </dev/null 2>&1 |
  sed -u -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\x1b[a-zA-Z]//g' | tee "$console" |
  grep --line-buffered -E '^(TIERVM-QEMU|\+ |## )'
qemu_rc=${PIPESTATUS[0]}
set -e
t_end=$(date +%s)
[ -n "${TIERVM_QEMU_KEEP_LOG:-}" ] && cp "$console" "$TIERVM_QEMU_KEEP_LOG"

problems=()
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
  problems+=("the boot hit the ${boot_timeout}s timeout")
elif [ "$qemu_rc" != 0 ]; then
  problems+=("qemu exited with status $qemu_rc")
fi
done_line=$(grep -a '^TIERVM-QEMU-DONE ' "$console" | tail -1 || true)
[ -n "$done_line" ] || problems+=("no TIERVM-QEMU-DONE line: /init did not finish (crash, panic or timeout)")
while IFS= read -r l; do problems+=("$l"); done < <(grep -a '^TIERVM-QEMU-CHECK FAIL ' "$console" || true)
# Every check the init script announces must report PASS or FAIL.
while IFS= read -r name; do
  grep -aq "^TIERVM-QEMU-CHECK \(PASS\|FAIL\|SKIP\) $name:" "$console" || problems+=("check $name announced but never reported")
done < <(grep -a '^TIERVM-QEMU-PLAN ' "$console" | sed 's/^TIERVM-QEMU-PLAN //' | tr ' ' '\n' | grep -v '^$' || true)
grep -aq '^TIERVM-QEMU-PLAN ' "$console" || problems+=("no TIERVM-QEMU-PLAN line: /init never started")
passed=$(grep -ac '^TIERVM-QEMU-CHECK PASS ' "$console" || true)

log "boot + checks took $((t_end - t_boot)) s (whole script $((t_end - t_start)) s); console log: $console"
if [ ${#problems[@]} -gt 0 ]; then
  echo "== qemu-host: FAILED (${#problems[@]} problem(s), $passed check(s) passed):" >&2
  for p in "${problems[@]}"; do echo "   $p" >&2; done
  echo "== last 40 console lines:" >&2
  tail -40 "$console" >&2
  exit 1
fi
skipped=$(grep -a '^TIERVM-QEMU-CHECK SKIP ' "$console" || true)
if [ -n "$skipped" ]; then
  echo "== qemu-host: SKIPPED (feature not in this tiervm; the check turns on by itself when it is):"
  echo "$skipped" | sed 's/^/   /'
fi
log "all $passed checks passed"
