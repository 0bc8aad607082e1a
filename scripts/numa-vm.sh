#!/usr/bin/env bash
# numa-vm.sh: run one binary inside a throwaway two-NUMA-node qemu VM.
#
# Why: the NUMA page-cache placement code (crates/sluice-warm/src/sys/numa.rs
# and friends) can only really be exercised on a machine with more than one
# NUMA node, and our dev/CI hosts have exactly one. qemu can fake a two-node
# topology cheaply, so this script boots a minimal Linux VM with
#   node 0 = cpu 0 + half the memory, node 1 = cpu 1 + the other half,
# runs BINARY ARGS... inside it as root on a fresh ext4 scratch disk, streams
# the guest console to stdout and exits with BINARY's exit code.
#
# Usage: scripts/numa-vm.sh [--mem-per-node MiB] [--timeout S] [--disk-size SIZE]
#                           [--accel auto|kvm|tcg] [--init-timeout S] [--stall-kvm-boot]
#                           [--append KERNEL-ARGS] BINARY [ARGS...]
#
#   --mem-per-node MiB  memory of each of the two nodes (default 1024)
#   --timeout S         kill qemu after S seconds, boot and BINARY together; a
#                       KVM attempt stopped by --init-timeout does not count
#                       against the TCG retry (default 600)
#   --disk-size SIZE    scratch disk size, as for truncate(1) (default 2G)
#   --accel MODE        auto: KVM where it can boot Debian's kernel, else TCG;
#                       kvm: try KVM even where auto would not; tcg: TCG only.
#                       A KVM guest that fails is retried with TCG (default auto)
#   --init-timeout S    stop a KVM guest whose init has not started within S
#                       seconds and retry with TCG (default 60)
#   --stall-kvm-boot    test the above: the KVM attempt starts with its CPUs
#                       paused, a guest that never reaches init
#   --append ARGS       extra kernel command line arguments
#
# Guest side: Debian bookworm's stock kernel (linux-image-amd64, 6.1.x,
# extracted, never installed on the host) plus an initramfs built here with
# busybox-static, BINARY, the shared libraries ldd reports for it and the
# modules needed to mount ext4 on virtio-blk. Inside the guest:
#   - the scratch disk is mounted on /scratch and /var/tmp; TMPDIR=HOME=/scratch,
#     cwd /scratch
#   - host environment variables named SLUICE_*, RUST_* and CARGO_* are passed on
#   - BINARY's stdout+stderr go to the console, stdin is /dev/null
# Exit status: BINARY's, 124 if the timeout fired, 125 if the guest never
# reported one (kernel panic, missing module, ...).
#
# KVM where it works, TCG (emulation, slower) otherwise. "Works" is more than
# /dev/kvm: under nested virtualisation qemu may fail to start a vCPU, and a
# PVM host (kvm_pvm) boots only PVM-enabled guest kernels; Debian's stalls
# silently after "Booting from ROM...". So the KVM guest's init prints a marker
# on the serial console first thing, and a watchdog stops a guest that has not
# printed it within --init-timeout; the run is then retried with TCG. The
# watchdog can be checked with --stall-kvm-boot (see docs/DEVELOPMENT.md).
# Fatal outcomes end with one "numa-vm: error: ..." line saying why.
#
# Cached artifacts (kernel, downloaded .deb) live in target/numa-vm/ and are
# reused; the initramfs and scratch disk are rebuilt in a per-run directory
# there and deleted afterwards. Needs root only to apt-get install missing
# host tools (qemu-system-x86, busybox-static, e2fsprogs, cpio).
set -euo pipefail

usage() {
    # Print the "Usage:" block of the header comment.
    sed -n '/^# Usage:/,/^#   --append/s/^# \{0,1\}//p' "$0" >&2
    exit 2
}

log() { printf 'numa-vm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 125; }

mem_per_node=1024
timeout_s=600
disk_size=2G
extra_append=
accel_mode=auto
# 60 s: a KVM guest reaches its init in a few seconds (kernel and initramfs
# are local files); a guest that has shown nothing for a minute is stuck, and
# waiting the whole --timeout for it is what made `make test` take 5 minutes
# longer on a PVM host.
init_timeout_s=60
stall_kvm_boot=false
while [[ $# -gt 0 ]]; do
    case $1 in
        --mem-per-node) mem_per_node=${2:?}; shift 2 ;;
        --timeout) timeout_s=${2:?}; shift 2 ;;
        --disk-size) disk_size=${2:?}; shift 2 ;;
        --append) extra_append=${2:?}; shift 2 ;;
        --accel) accel_mode=${2:?}; shift 2 ;;
        --init-timeout) init_timeout_s=${2:?}; shift 2 ;;
        --stall-kvm-boot) stall_kvm_boot=true; shift ;;
        -h|--help) usage ;;
        --) shift; break ;;
        -*) log "unknown option $1"; usage ;;
        *) break ;;
    esac
done
[[ $# -ge 1 ]] || usage
[[ $mem_per_node =~ ^[0-9]+$ && $mem_per_node -ge 128 ]] || die "--mem-per-node must be a number of MiB >= 128"
[[ $timeout_s =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
[[ $init_timeout_s =~ ^[0-9]+$ && $init_timeout_s -ge 1 ]] || die "--init-timeout must be a number of seconds >= 1"
[[ $accel_mode =~ ^(auto|kvm|tcg)$ ]] || die "--accel must be auto, kvm or tcg"

binary=$1; shift
# Allow a bare command name (e.g. "sh"), like exec would.
if [[ $binary != */* ]]; then
    found=$(command -v -- "$binary") || die "$binary: not found in PATH"
    binary=$found
fi
[[ -f $binary && -x $binary ]] || die "$binary: not an executable file"
binary=$(readlink -f -- "$binary")

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=$repo/target/numa-vm
mkdir -p "$cache"

# ---------------------------------------------------------------- host tools
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
# The plain "busybox" package is dynamically linked; the guest has no libc
# unless BINARY brings one, so insist on the static build.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v cpio >/dev/null || need+=(cpio)
if [[ ${#need[@]} -gt 0 ]]; then
    log "installing missing host tools: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Package lists may be missing or stale on a fresh machine: update and retry once.
    apt-get install -y -q --no-install-recommends "${need[@]}" >&2 \
        || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${need[@]}" >&2; } \
        || die "apt-get install ${need[*]} failed"
fi
busybox=/bin/busybox
[[ -x $busybox ]] || die "$busybox missing after installing busybox-static"

# -------------------------------------------------------------------- kernel
# Debian's stock kernel has CONFIG_NUMA and virtio as modules, which is all we
# need. It is extracted into target/ rather than installed so the host's /boot
# and bootloader are untouched.
kdir=$cache/kernel
if [[ ! -f $kdir/.done ]]; then
    kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null \
        | awk '$1 ~ /Depends:$/ && $2 ~ /^linux-image-[0-9].*-amd64$/ { print $2; exit }') || true
    if [[ -z $kpkg ]]; then
        apt-get update -q >&2
        kpkg=$(apt-cache depends linux-image-amd64 \
            | awk '$1 ~ /Depends:$/ && $2 ~ /^linux-image-[0-9].*-amd64$/ { print $2; exit }')
    fi
    [[ -n $kpkg ]] || die "cannot resolve the kernel package behind linux-image-amd64"
    log "downloading $kpkg (linux-image-amd64) into $cache/debs"
    mkdir -p "$cache/debs"
    rm -f "$cache/debs/${kpkg}_"*.deb
    (cd "$cache/debs" && apt-get download -q "$kpkg" >&2)
    debs=("$cache/debs/${kpkg}_"*.deb)
    deb=${debs[0]}
    rm -rf "$kdir"
    mkdir -p "$kdir"
    dpkg-deb -x "$deb" "$kdir"
    echo "$kpkg" >"$kdir/.done"
fi
vmlinuz=$(compgen -G "$kdir/boot/vmlinuz-*" | head -n1) || true
[[ -n $vmlinuz ]] || die "no vmlinuz in $kdir (delete it to re-download)"
kver=${vmlinuz##*/vmlinuz-}
moddir=
for d in "$kdir/lib/modules/$kver" "$kdir/usr/lib/modules/$kver"; do
    [[ -d $d/kernel ]] && moddir=$d && break
done
[[ -n $moddir ]] || die "no modules for $kver in $kdir"
# The .deb ships no modules.dep (its postinst runs depmod on install), so
# generate it; busybox's depmod will do when kmod is not installed.
if [[ ! -f $moddir/modules.dep ]]; then
    base=${moddir%/lib/modules/"$kver"}
    if command -v depmod >/dev/null; then
        depmod -b "$base" "$kver"
    else
        "$busybox" depmod -b "$base" "$kver"
    fi
fi

# ------------------------------------------------------------------ run dir
run=$(mktemp -d "$cache/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
root=$run/root
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,var/tmp,scratch,etc/numa-vm,lib/modules,opt/numa-vm/bin}

# ----------------------------------------------------------------- busybox
cp "$busybox" "$root/bin/busybox"
# Create the applet symlinks on the host so the guest needs no install step.
while read -r applet; do
    [[ -n $applet && ! -e $root/$applet ]] || continue
    mkdir -p "$root/$(dirname "$applet")"
    ln -s /bin/busybox "$root/$applet"
done < <("$busybox" --list-full)

# ------------------------------------------------------- binary + libraries
# BINARY goes under /opt so that e.g. /bin/sh as BINARY cannot replace the
# busybox shell that /init runs under.
guest_bin=/opt/numa-vm/bin/$(basename "$binary")
cp "$binary" "$root$guest_bin"
if ldd_out=$(ldd "$binary" 2>&1); then
    # "libfoo.so => /path (0x..)" and "/lib64/ld-linux-x86-64.so.2 (0x..)";
    # copy each to the same absolute path so the loader and any RUNPATH find it.
    if grep -q 'not found' <<<"$ldd_out"; then
        die "ldd $binary: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t' ' ')"
    fi
    while read -r lib; do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$ldd_out" | sort -u)
else
    log "ldd: ${ldd_out//$'\n'/ } (treating $binary as static)"
fi

# ----------------------------------------------------------------- modules
# Resolve virtio_pci, virtio_blk and ext4 (+ crc32c, which ext4 only asks for
# by alias at mount time via a softdep, and metadata_csum needs it) against
# modules.dep, dependencies first. Built-in ones are skipped.
declare -A dep_of=() path_of=() builtin=() loaded=()
# modname PATH: sets $mod to the module name (foo-bar.ko.xz -> foo_bar);
# no subshell, as this runs for each of the ~4000 modules.
modname() { mod=${1##*/}; mod=${mod%%.ko*}; mod=${mod//-/_}; }
while IFS= read -r line; do
    p=${line%%:*}
    dep_of[$p]=${line#*:}
    modname "$p"; path_of[$mod]=$p
done <"$moddir/modules.dep"
while IFS= read -r p; do modname "$p"; builtin[$mod]=1; done <"$moddir/modules.builtin"
mod_order=()
add_mod_path() {
    local p=$1 d
    [[ -z ${loaded[$p]:-} ]] || return 0
    loaded[$p]=1
    for d in ${dep_of[$p]}; do add_mod_path "$d"; done
    mod_order+=("$p")
}
for m in virtio_pci virtio_blk crc32c_generic ext4; do
    if [[ -n ${builtin[$m]:-} ]]; then continue; fi
    [[ -n ${path_of[$m]:-} ]] || die "module $m neither built in nor in $moddir/modules.dep"
    add_mod_path "${path_of[$m]}"
done
: >"$root/etc/numa-vm/modules"
for p in "${mod_order[@]}"; do
    modname "$p"
    out=$root/lib/modules/$mod.ko
    # busybox insmod cannot load compressed modules: decompress on the host.
    case $p in
        *.ko.xz) xz -dc "$moddir/$p" >"$out" ;;
        *.ko.zst) zstd -qdc "$moddir/$p" >"$out" ;;
        *.ko.gz) gzip -dc "$moddir/$p" >"$out" ;;
        *) cp "$moddir/$p" "$out" ;;
    esac
    echo "/lib/modules/${out##*/}" >>"$root/etc/numa-vm/modules"
done

# ------------------------------------------------------------- environment
# Single-quote for the guest's POSIX sh ('\'' for embedded quotes); safe for
# spaces, newlines, $ and backslashes.
shquote() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }
: >"$root/etc/numa-vm/env"
while IFS= read -r name; do
    if [[ $name =~ ^(SLUICE_|RUST_|CARGO_)[A-Za-z0-9_]*$ ]]; then
        printf 'export %s=%s\n' "$name" "$(shquote "${!name}")" >>"$root/etc/numa-vm/env"
    fi
done < <(compgen -e)

args=
for a in "$@"; do args+=" $(shquote "$a")"; done

# -------------------------------------------------------------------- /init
# The first line /init prints; the host watches the console for it.
init_marker="init started"
cat >"$root/init" <<EOF
#!/bin/busybox sh
# Generated by scripts/numa-vm.sh for one run.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
# Make sure our stdio is the serial console even if the initramfs had no
# /dev/console node when the kernel started us.
exec </dev/console >/dev/console 2>&1

fail() { echo "numa-vm: guest error: \$*"; sync; poweroff -f; sleep 10; }

# The host's watchdog waits for this line: print it before anything can hang.
echo "numa-vm: guest kernel \$(uname -r), $init_marker"
for m in \$(cat /etc/numa-vm/modules); do
    insmod "\$m" || fail "insmod \$m"
done
# virtio-blk probes asynchronously; wait up to ~10 s for the disk node.
i=0
while [ ! -b /dev/vda ] && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i + 1)); done
mount -t ext4 /dev/vda /scratch || fail "mount /dev/vda on /scratch"
# Page-cache tests look for a disk file system at /var/tmp (/tmp is often tmpfs).
mkdir -p /var/tmp && mount --bind /scratch /var/tmp || fail "bind /scratch on /var/tmp"
export TMPDIR=/scratch HOME=/scratch

echo "numa-vm: /sys/devices/system/node: \$(ls /sys/devices/system/node/ | tr '\n' ' ')"
for n in /sys/devices/system/node/node[0-9]*; do
    echo "numa-vm: \${n##*/}: cpus \$(cat \$n/cpulist), MemTotal \$(awk '/MemTotal/ { print \$4, \$5 }' \$n/meminfo)"
done

. /etc/numa-vm/env
set -- $args
cd /scratch
echo "numa-vm: running" $(shquote "$guest_bin") "\$@"
$(shquote "$guest_bin") "\$@" </dev/null 2>&1
rc=\$?
echo "NUMA-VM-EXIT \$rc"
sync
poweroff -f
EOF
chmod 755 "$root/init"
# The kernel opens /dev/console for init before devtmpfs is mounted; a real
# node avoids the "unable to open an initial console" path (needs root).
[[ $EUID -ne 0 ]] || mknod -m 600 "$root/dev/console" c 5 1

initrd=$run/initrd.gz
(cd "$root" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet | gzip -1) >"$initrd"

# ------------------------------------------------------------ scratch disk
disk=$run/scratch.img
truncate -s "$disk_size" "$disk"
# cache=none needs O_DIRECT, which some host filesystems (tmpfs, some
# overlays) refuse; probe (before mkfs) instead of letting qemu fail later.
if dd if=/dev/zero of="$disk" bs=4096 count=1 oflag=direct conv=notrunc status=none 2>/dev/null; then
    disk_cache=none
else
    disk_cache=writeback
    log "O_DIRECT not supported under $run; using cache=writeback"
fi
mkfs.ext4 -q -F "$disk"

# -------------------------------------------------------------------- qemu
half=$mem_per_node
total=$((2 * half))
append="console=ttyS0 panic=-1 quiet${extra_append:+ $extra_append}"
qemu_args=(
    -nographic -nodefaults -no-user-config -no-reboot
    -serial stdio
    -smp 2 -m "${total}M"
    -object "memory-backend-ram,id=m0,size=${half}M"
    -object "memory-backend-ram,id=m1,size=${half}M"
    -numa "node,nodeid=0,cpus=0,memdev=m0"
    -numa "node,nodeid=1,cpus=1,memdev=m1"
    -kernel "$vmlinuz" -initrd "$initrd" -append "$append"
    -drive "file=$disk,if=virtio,format=raw,cache=$disk_cache"
)
console_log=$run/console.log

# Runs qemu with the given accelerator args, streaming the console to stdout
# (unbuffered, CRs stripped) and into $console_log. Returns qemu's status.
# SeaBIOS clears/resets the terminal with escape sequences; drop those up to
# the guest's first line so an interactive terminal is not wiped, but leave
# BINARY's own output untouched.
# With WATCH_INIT=S set, a watchdog stops qemu when the guest has not printed
# $init_marker S seconds after qemu started, and leaves $run/stalled behind.
boot() {
    local status watchdog=
    rm -f "$console_log" "$run/qemu.pid" "$run/stalled"
    if [[ -n ${WATCH_INIT:-} ]]; then
        init_watchdog "$WATCH_INIT" &
        watchdog=$!
    fi
    set +e
    timeout -k 10 "$timeout_s" qemu-system-x86_64 "$@" -pidfile "$run/qemu.pid" "${qemu_args[@]}" </dev/null \
        | sed -u -e 's/\r$//' -e "1,/$init_marker/{ s/\x1bc//g; s/\x1b\[[0-9;?]*[A-Za-z]//g; }" \
        | tee "$console_log"
    status=${PIPESTATUS[0]}
    set -e
    if [[ -n $watchdog ]]; then
        kill "$watchdog" 2>/dev/null || true
        wait "$watchdog" 2>/dev/null || true
    fi
    return "$status"
}

# init_watchdog S: polls the console log for the init marker for S seconds;
# without it, marks the boot stalled and stops qemu (TERM, then KILL).
init_watchdog() {
    local deadline=$((SECONDS + $1)) pid
    while [[ $SECONDS -lt $deadline ]]; do
        grep -qa "$init_marker" "$console_log" 2>/dev/null && return 0
        sleep 0.2
    done
    grep -qa "$init_marker" "$console_log" 2>/dev/null && return 0
    : >"$run/stalled"
    pid=$(cat "$run/qemu.pid" 2>/dev/null) || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in {1..50}; do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

seconds_since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }

# KVM is worth a try when /dev/kvm is usable and qemu can start a paused
# guest on it (under nested virtualisation qemu may abort setting up the
# vCPU; this takes well under a second), and the host is not PVM, which runs
# only PVM-enabled guest kernels. kvm_skip says why not, in a few words.
kvm_usable=false
kvm_skip=
if [[ ! -r /dev/kvm || ! -w /dev/kvm ]]; then
    kvm_skip="/dev/kvm not usable"
elif probe=$({ sleep 0.5; echo quit; } | timeout 20 qemu-system-x86_64 -enable-kvm -cpu host \
        -nodefaults -display none -S -monitor stdio -m 64 2>&1); then
    kvm_usable=true
    if [[ -d /sys/module/kvm_pvm ]]; then
        kvm_skip="KVM here is PVM (kvm_pvm), which boots only PVM-enabled guest kernels"
    fi
else
    kvm_skip="KVM probe failed: $(grep -m1 -i error <<<"$probe" || tail -n1 <<<"$probe")"
fi

try_kvm=false
case $accel_mode in
    auto) [[ -z $kvm_skip ]] && try_kvm=true ;;
    kvm) $kvm_usable && try_kvm=true ;;
esac
# --stall-kvm-boot needs an attempt to stall: with paused CPUs the
# accelerator does not matter, so TCG stands in where KVM cannot start.
kvm_args=(-enable-kvm -cpu host)
kvm_label=KVM
if $stall_kvm_boot; then
    try_kvm=true
    $kvm_usable || { kvm_args=(-accel tcg -cpu max); kvm_label="TCG standing in for KVM"; }
    kvm_args+=(-S)
    log "--stall-kvm-boot: the $kvm_label guest starts with its CPUs paused and never reaches init"
fi

accel=
kvm_s=
kvm_note=
start=$(date +%s.%N)
status=0
if $try_kvm; then
    log "booting $kver with $kvm_label: 2 nodes x ${half} MiB, init within ${init_timeout_s}s, timeout ${timeout_s}s"
    WATCH_INIT=$init_timeout_s boot "${kvm_args[@]}" || status=$?
    if grep -qa "$init_marker" "$console_log"; then
        accel=KVM
    else
        # Whatever went wrong before init (qemu refused KVM, a stall, a
        # panic), the guest never ran BINARY: retry once with TCG.
        kvm_s=$(seconds_since "$start")
        if [[ -f $run/stalled ]]; then
            kvm_note="$kvm_label guest did not start its init in ${init_timeout_s}s; stopped it after ${kvm_s}s"
        else
            kvm_note="$kvm_label guest ended before its init (qemu status $status) after ${kvm_s}s"
        fi
        echo >&2  # the console may have stopped mid-line
        log "$kvm_note; retrying with TCG (slow)"
    fi
elif [[ $accel_mode != tcg ]]; then
    kvm_note=${kvm_skip:-KVM not usable}
    log "$kvm_note; using TCG (slow)"
fi
if [[ -z $accel ]]; then
    accel=TCG
    status=0
    log "booting $kver with TCG: 2 nodes x ${half} MiB, timeout ${timeout_s}s"
    boot -accel tcg -cpu max || status=$?
fi
how="$accel${kvm_note:+ ($kvm_note)}"
log "accel: $how"
elapsed=$(seconds_since "$start")

code=$(grep -a -o 'NUMA-VM-EXIT [0-9]*' "$console_log" | tail -n1 | cut -d' ' -f2) || true
if [[ -z $code ]]; then
    echo >&2  # the console may have stopped mid-line
    if [[ $status -eq 124 || $status -eq 137 ]]; then
        log "error: timed out after ${timeout_s}s ($accel) without the guest reporting an exit code"
    elif ! grep -qa "$init_marker" "$console_log"; then
        log "error: the $accel guest ended before its init started (qemu status $status, ${elapsed}s);" \
            "kernel panic? see the console output above"
    else
        log "error: the guest never reported an exit code (qemu status $status, $accel, ${elapsed}s);" \
            "init failure? see the console output above"
    fi
    exit 125
fi
log "guest exit code $code ($accel, ${elapsed}s${kvm_s:+ in all, ${kvm_s}s of them the KVM attempt})"
exit "$code"
