#!/bin/bash
# Build the e2e guest: a stock Debian kernel (booted as an uncompressed vmlinux through its PVH
# entry, which saves ~10 s per boot under TCG), a tiny busybox initramfs, and an ext4 root made by
# debootstrap with the NVMe host tools and a subset of the kernel's modules.
#
# Usage: build-image.sh OUTDIR [bookworm|trixie]
#   bookworm (default): Debian 12, kernel 6.1, nvme-cli 2.4 — the image most scenarios use.
#   trixie: Debian 13, kernel 6.12 (NVMe in-band authentication, NVMe/TCP TLS), nvme-cli 2.13,
#           tlshd; scenarios ask for it with a "# e2e-image: trixie" line.
# Package and module lists: guest-packages.txt / guest-modules.txt for every release, plus
# guest-packages-RELEASE.txt / guest-modules-RELEASE.txt when present.
# Writes OUTDIR/{vmlinux,initrd.img,rootfs.ext4,kernel-version,release,build.log} atomically
# (built in OUTDIR.tmp, renamed at the end). run.sh decides when to call this (cache key = hash
# of the files in this directory and the release). Needs root, debootstrap, kmod,
# busybox-static, e2fsprogs, cpio, xz.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-image.sh OUTDIR [bookworm|trixie]}
suite=${2:-bookworm}
case $suite in
bookworm | trixie) ;;
*) echo "build-image.sh: unknown release '$suite' (bookworm or trixie)" >&2; exit 2 ;;
esac
tmp="$out.tmp"
host_suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")

log() { printf '[image] %s\n' "$*" >&2; }

# debootstrap mounts proc/sys inside the chroot; never leave them mounted (or rm -rf into them).
unmount_chroot() {
	{ grep -o " $tmp/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" || true; done
}
trap unmount_chroot EXIT
unmount_chroot
rm -rf "$tmp"
mkdir -p "$tmp"
exec 3>"$tmp/build.log"
start=$(date +%s)

# The Debian mirror this host already uses (never hard-coded here): the URI of the first
# "<release> main" index target that apt knows (the guest's release, else the host's own: the same
# mirror carries every release), unless NVMFD_E2E_MIRROR overrides it.
mirror=${NVMFD_E2E_MIRROR:-}
if [ -z "$mirror" ]; then
	mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 'Identifier: Packages' |
		awk -v s="$suite" -v h="$host_suite" '$3 == "main" && $2 == s { print $1; exit }
			$3 == "main" && $2 == h && !m { m = $1 } END { if (m) print m }' | head -n1)
fi
[ -n "$mirror" ] || { log "no Debian mirror configured in apt; set NVMFD_E2E_MIRROR"; exit 1; }

# --- root filesystem ----------------------------------------------------------------------------
root="$tmp/root"
# list NAME: the entries of image/NAME.txt and of image/NAME-RELEASE.txt when there is one.
list() {
	local f
	for f in "$here/$1.txt" "$here/$1-$suite.txt"; do
		[ ! -f "$f" ] || sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$f"
	done
}
packages=$(list guest-packages | paste -sd, -)
log "debootstrap $suite (minbase + $packages) from $mirror"
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >&3 2>&1 ||
	{ log "debootstrap failed; see $tmp/build.log"; tail -n 20 "$tmp/build.log" >&2; exit 1; }

# --- kernel -------------------------------------------------------------------------------------
# The host's apt when the guest runs the host's release (it also knows the -security and -updates
# kernels); otherwise the guest root's own apt, whose package lists debootstrap just fetched.
if [ "$suite" = "$host_suite" ]; then
	kapt() { "$@"; }
	kdownload() { (cd "$tmp" && apt-get download "$1"); }
else
	cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
	kapt() { chroot "$root" "$@"; }
	kdownload() {
		chroot "$root" sh -c 'mkdir -p /tmp/k && cd /tmp/k && apt-get download "$1"' sh "$1" &&
			mv "$root"/tmp/k/*.deb "$tmp/" && rm -rf "$root/tmp/k"
	}
fi
kpkg=${NVMFD_E2E_KERNEL_PKG:-}
resolve_kernel() {
	kapt apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
if [ -z "$kpkg" ]; then
	kpkg=$(resolve_kernel)
	if [ -z "$kpkg" ]; then
		# A machine whose apt lists were never fetched (or were cleaned) knows no kernel yet.
		log "apt knows no linux-image-amd64; apt-get update"
		kapt apt-get update -qq >&3 2>&1 || true
		kpkg=$(resolve_kernel)
	fi
fi
[ -n "$kpkg" ] || { log "cannot resolve the kernel package (apt-get update?)"; exit 1; }
log "kernel package $kpkg"
kdownload "$kpkg" >&3 2>&1
mkdir "$tmp/kernel"
dpkg-deb -x "$tmp"/"$kpkg"_*.deb "$tmp/kernel"
rm -f "$tmp"/"$kpkg"_*.deb
# Debian 13's packages ship the modules under usr/lib (merged /usr); depmod -b wants BASE/lib.
if [ ! -d "$tmp/kernel/lib/modules" ] && [ -d "$tmp/kernel/usr/lib/modules" ]; then
	mkdir -p "$tmp/kernel/lib"
	mv "$tmp/kernel/usr/lib/modules" "$tmp/kernel/lib/modules"
fi
kver=$(ls "$tmp/kernel/lib/modules")
echo "$kver" >"$tmp/kernel-version"
depmod -b "$tmp/kernel" "$kver"

# The bzImage carries the kernel as a compressed stream (xz in Debian's 6.1, xz or zstd in later
# kernels); pull it out (as scripts/extract-vmlinux does: find the magic, decompress from there)
# so qemu can boot the ELF directly.
bz="$tmp/kernel/boot/vmlinuz-$kver"
found=
try_unpack() { # MAGIC-REGEX DECOMPRESSOR…
	local magic=$1 off
	shift
	command -v "$1" >/dev/null || return 1
	for off in $(LC_ALL=C grep -aboP "$magic" "$bz" | cut -d: -f1); do
		# tail may die of SIGPIPE once the decompressor has its stream, and zstd (which has no
		# single-frame option) fails on the bytes after its frame: as in extract-vmlinux, what
		# counts is not the exit status but an ELF header at the start of the output and the
		# whole file after it (its section header table, e_shoff + e_shnum * e_shentsize, last).
		"$@" < <(tail -c +"$((off + 1))" "$bz" 2>/dev/null) >"$tmp/vmlinux" 2>/dev/null
		[ "$(head -c 4 "$tmp/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || continue
		local shoff shentsize shnum
		shoff=$(od -An -t u8 -j 40 -N 8 "$tmp/vmlinux" | tr -d ' ')
		shentsize=$(od -An -t u2 -j 58 -N 2 "$tmp/vmlinux" | tr -d ' ')
		shnum=$(od -An -t u2 -j 60 -N 2 "$tmp/vmlinux" | tr -d ' ')
		[ "$(stat -c %s "$tmp/vmlinux")" -ge $((shoff + shnum * shentsize)) ] && return 0
	done
	return 1
}
try_unpack '\xfd7zXZ\x00' xz -dcq --single-stream && found=xz
[ -n "$found" ] || { try_unpack '\x28\xb5\x2f\xfd' zstd -dcq && found=zstd; }
[ -n "$found" ] || { log "no xz- or zstd-compressed ELF found in $bz"; exit 1; }
log "vmlinux extracted ($(du -m "$tmp/vmlinux" | cut -f1) MiB)"

# Module list → full dependency closure, in load order. A "dir:PATH" line stands for every module
# under lib/modules/VERSION/PATH.
kmods="$tmp/kernel/lib/modules/$kver"
wanted=$(list guest-modules | while read -r m; do
		case $m in
		dir:*) find "$kmods/${m#dir:}" -name '*.ko*' | sed -e 's,.*/,,' -e 's/\.ko.*//' | sort ;;
		*) echo "$m" ;;
		esac
	done)
modlines() { # modname… → "relative/path.ko args" lines, dependencies first, de-duplicated
	for m in "$@"; do
		modprobe -d "$tmp/kernel" -S "$kver" --show-depends "$m" || { log "module $m: not in $kver"; exit 1; }
	done | awk -v p="$tmp/kernel/lib/modules/$kver/" '$1 == "insmod" {
		# A plain prefix, not a regex: Debian 13 kernel versions have a "+" ("6.12.x+deb13-amd64").
		path = $2; if (index(path, p) == 1) path = substr(path, length(p) + 1)
		$1 = ""; $2 = ""; args = $0; gsub(/^ +| +$/, "", args)
		if (!seen[path]++) print path (args == "" ? "" : " " args)
	}'
}
# shellcheck disable=SC2086
all_modules=$(modlines $wanted)
# Only what mounting the root and the 9p shares needs goes into the initramfs.
BOOT_MODULES="virtio_pci virtio_blk crc32c_generic ext4 9pnet_virtio 9p"
# Debian 13's kernel waits for a seeded CRNG before it hands out keys (DH-HMAC-CHAP, TLS); qemu64
# has no RDRAND, so run.sh gives trixie guests a virtio-rng device, bound from the start.
[ "$suite" = bookworm ] || BOOT_MODULES="$BOOT_MODULES virtio_rng"
# shellcheck disable=SC2086
boot_modules=$(modlines $BOOT_MODULES)

# --- guest root: modules and identity -----------------------------------------------------------
mdir="$root/lib/modules/$kver"
mkdir -p "$mdir"
echo "$all_modules" | while read -r path _; do
	install -D -m 0644 "$tmp/kernel/lib/modules/$kver/$path" "$mdir/$path"
done
cp "$tmp/kernel/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$mdir/"
depmod -b "$root" "$kver"
log "$(echo "$all_modules" | wc -l) modules installed in the guest"

# Identity and mount points the guest init expects.
echo nvmfd-e2e >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 nvmfd-e2e\n::1 localhost\n' >"$root/etc/hosts"
mkdir -p "$root/etc/nvme" "$root/e2e" "$root/opt/nvmfd" "$root/out"
# A fixed host identity keeps results comparable between runs.
echo "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000001" >"$root/etc/nvme/hostnqn"
echo "6e766d66-6400-4e32-8565-326500000001" >"$root/etc/nvme/hostid"
# Nothing in the guest needs these; dropping them keeps the image small and mkfs quick.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
	"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/usr/share/info/*

# Room for file namespaces and fio files under /var/tmp; qemu's snapshot=on keeps the image pristine.
used=$(du -sm "$root" | cut -f1)
size=$((used + ${NVMFD_E2E_FREE_MB:-1536}))
mkfs.ext4 -q -F -L nvmfd-e2e -E lazy_itable_init=1,lazy_journal_init=1 -d "$root" \
	"$tmp/rootfs.ext4" "${size}M" >&3 2>&1
log "rootfs.ext4: ${size} MiB (${used} MiB used)"

# --- initramfs ----------------------------------------------------------------------------------
ird="$tmp/initramfs"
mkdir -p "$ird"/{bin,dev,proc,sys,newroot,lib/modules}
cp /bin/busybox "$ird/bin/busybox"
install -m 0755 "$here/initramfs-init" "$ird/init"
# busybox insmod takes plain .ko files only: Debian 13 ships its modules xz-compressed.
echo "$boot_modules" | while read -r path args; do
	src="$tmp/kernel/lib/modules/$kver/$path"
	case $path in
	*.ko.xz) mkdir -p "$(dirname "$ird/lib/modules/$path")" && xz -dc "$src" >"$ird/lib/modules/${path%.xz}" ;;
	*.ko.zst) mkdir -p "$(dirname "$ird/lib/modules/$path")" && zstd -dcq "$src" >"$ird/lib/modules/${path%.zst}" ;;
	*) install -D -m 0644 "$src" "$ird/lib/modules/$path" ;;
	esac
	path=${path%.xz}
	echo "${path%.zst}${args:+ $args}"
done >"$ird/boot-modules.list"
(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$tmp/initrd.img"

echo "$suite" >"$tmp/release"
rm -rf "$root" "$ird" "$tmp/kernel"
log "image built in $(($(date +%s) - start)) s"
exec 3>&-
rm -rf "$out"
mv "$tmp" "$out"
