#!/bin/bash
# Build the e2e guest: a stock Debian bookworm kernel (booted as an uncompressed vmlinux through
# its PVH entry, which saves ~10 s per boot under TCG), a tiny busybox initramfs, and an ext4 root
# made by debootstrap with the NVMe host tools and a subset of the kernel's modules.
#
# Usage: build-image.sh OUTDIR
# Writes OUTDIR/{vmlinux,initrd.img,rootfs.ext4,kernel-version,build.log} atomically (built in
# OUTDIR.tmp, renamed at the end). run.sh decides when to call this (cache key = hash of the
# files in this directory). Needs root, debootstrap, kmod, busybox-static, e2fsprogs, cpio, xz.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-image.sh OUTDIR}
tmp="$out.tmp"
suite=bookworm

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

# The Debian mirror this host already uses (never hard-coded here): first "bookworm main" index
# target that apt knows, unless NVMFD_E2E_MIRROR overrides it.
mirror=${NVMFD_E2E_MIRROR:-}
if [ -z "$mirror" ]; then
	mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 'Identifier: Packages' |
		awk -v s="$suite" '$2 == s && $3 == "main" { print $1; exit }')
fi
[ -n "$mirror" ] || { log "no Debian $suite mirror configured in apt; set NVMFD_E2E_MIRROR"; exit 1; }

# --- kernel -------------------------------------------------------------------------------------
kpkg=${NVMFD_E2E_KERNEL_PKG:-}
resolve_kernel() {
	apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
if [ -z "$kpkg" ]; then
	kpkg=$(resolve_kernel)
	if [ -z "$kpkg" ]; then
		# A machine whose apt lists were never fetched (or were cleaned) knows no kernel yet.
		log "apt knows no linux-image-amd64; apt-get update"
		apt-get update -qq >&3 2>&1 || true
		kpkg=$(resolve_kernel)
	fi
fi
[ -n "$kpkg" ] || { log "cannot resolve the kernel package (apt-get update?)"; exit 1; }
log "kernel package $kpkg"
(cd "$tmp" && apt-get download "$kpkg" >&3 2>&1)
mkdir "$tmp/kernel"
dpkg-deb -x "$tmp"/"$kpkg"_*.deb "$tmp/kernel"
rm -f "$tmp"/"$kpkg"_*.deb
kver=$(ls "$tmp/kernel/lib/modules")
echo "$kver" >"$tmp/kernel-version"
depmod -b "$tmp/kernel" "$kver"

# The bzImage carries the kernel as an xz stream; pull it out (as scripts/extract-vmlinux does:
# find the xz magic FD 37 7A 58 5A 00, decompress from there) so qemu can boot the ELF directly.
bz="$tmp/kernel/boot/vmlinuz-$kver"
found=
for off in $(LC_ALL=C grep -aboP '\xfd7zXZ\x00' "$bz" | cut -d: -f1); do
	# tail may die of SIGPIPE once xz has its single stream; only xz's status matters.
	if xz -dcq --single-stream < <(tail -c +"$((off + 1))" "$bz" 2>/dev/null) >"$tmp/vmlinux" 2>/dev/null &&
		[ "$(head -c 4 "$tmp/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
		found=1
		break
	fi
done
[ -n "$found" ] || { log "no xz-compressed ELF found in $bz"; exit 1; }
log "vmlinux extracted ($(du -m "$tmp/vmlinux" | cut -f1) MiB)"

# Module list → full dependency closure, in load order.
wanted=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/guest-modules.txt")
modlines() { # modname… → "relative/path.ko args" lines, dependencies first, de-duplicated
	for m in "$@"; do
		modprobe -d "$tmp/kernel" -S "$kver" --show-depends "$m" || { log "module $m: not in $kver"; exit 1; }
	done | awk -v p="$tmp/kernel/lib/modules/$kver/" '$1 == "insmod" {
		path = $2; sub(p, "", path); $1 = ""; $2 = ""; args = $0; gsub(/^ +| +$/, "", args)
		if (!seen[path]++) print path (args == "" ? "" : " " args)
	}'
}
# shellcheck disable=SC2086
all_modules=$(modlines $wanted)
# Only what mounting the root and the 9p shares needs goes into the initramfs.
BOOT_MODULES="virtio_pci virtio_blk crc32c_generic ext4 9pnet_virtio 9p"
# shellcheck disable=SC2086
boot_modules=$(modlines $BOOT_MODULES)

# --- root filesystem ----------------------------------------------------------------------------
root="$tmp/root"
packages=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/guest-packages.txt" | paste -sd, -)
log "debootstrap $suite (minbase + $packages) from the host's mirror"
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >&3 2>&1 ||
	{ log "debootstrap failed; see $tmp/build.log"; tail -n 20 "$tmp/build.log" >&2; exit 1; }

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
echo "$boot_modules" | while read -r path _; do
	install -D -m 0644 "$tmp/kernel/lib/modules/$kver/$path" "$ird/lib/modules/$path"
done
echo "$boot_modules" >"$ird/boot-modules.list"
(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$tmp/initrd.img"

rm -rf "$root" "$ird" "$tmp/kernel"
log "image built in $(($(date +%s) - start)) s"
exec 3>&-
rm -rf "$out"
mv "$tmp" "$out"
