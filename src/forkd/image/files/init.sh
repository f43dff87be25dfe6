#!/bin/busybox sh
# forkd initramfs /init: load the virtio modules (the Debian cloud kernel builds
# them as modules), mount the root disk and hand PID 1 to the guest agent.
# Everything here runs before the agent exists, so failures are printed to the
# serial console (the host shows its tail in the error) and the VM powers off
# instead of hanging until the host's boot timeout.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

die() {
    echo "forkd-init: FATAL: $*"
    echo o > /proc/sysrq-trigger 2>/dev/null
    poweroff -f
}

for m in $(cat /modules.order); do
    insmod "/modules/$m.ko" || echo "forkd-init: insmod $m failed"
done

opt() { sed -n "s/.*forkd\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }

if grep -q 'forkd.probe=1' /proc/cmdline; then
    echo "FORKD-PROBE-OK"
    poweroff -f
fi

root=$(opt root); root=${root:-/dev/vda}
i=0
while [ ! -b "$root" ]; do
    i=$((i + 1)); [ $i -gt 200 ] && die "root disk $root did not appear"
    sleep 0.05
done
mkdir -p /newroot
mount -t ext4 -o rw "$root" /newroot || die "cannot mount $root as ext4 (is the image an ext4 filesystem?)"
# An image without a Python of its own carries forkd's (image/guest_runtime.py), started through its
# own loader and libraries: nothing of the image's userland (or its absence) is needed.
runtime=/.forkd/runtime  # guest_runtime.RUNTIME_DIR
if [ -x "/newroot$runtime/bin/python3" ]; then
    set -- "$runtime/so/ld-linux-x86-64.so.2" --library-path "$runtime/so" "$runtime/bin/python3" -E -S
else
    [ -x /newroot/usr/bin/python3 ] || die "the root filesystem has no /usr/bin/python3 (and no $runtime)"
    set -- /usr/bin/python3
fi
agent=/opt/forkd/forkd/guest/agent/__main__.py  # rootfs.AGENT_ENTRY
[ -f "/newroot$agent" ] || die "the root filesystem has no forkd agent ($agent)"
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
exec switch_root /newroot "$@" -u "$agent"
