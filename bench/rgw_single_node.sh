#!/usr/bin/env bash
# A single-node Ceph RADOS Gateway on loopback for bench/s3_topup.py: an S3 server whose bucket index is a
# sorted key-value map, so a ListObjectsV2 page costs O(page) as on S3 (moto's scans the bucket per page).
# One monitor, one OSD on memstore (objects held in memory, 16 GiB at most), one gateway on
# 127.0.0.1:7480 with the bench's user (the access key and secret of bench/common.py's MotoBucket).
# Debian's packages (bookworm: Ceph 16.2 "Pacific"); nothing is downloaded but them.
#
#   bench/rgw_single_node.sh start [DIR]   # DIR: its data, logs and pid files (default bench/results/rgw)
#   bench/rgw_single_node.sh stop [DIR]    # ends the three daemons it started (by their pid files)
set -euo pipefail

action=${1:-start}
dir=${2:-"$(cd "$(dirname "$0")" && pwd)/results/rgw"}
conf="$dir/ceph.conf"
ceph_cmd=(ceph -c "$conf")

stop() {
    for name in client.rgw.a osd.0 mon.a; do
        pid_file="$dir/run/$name.pid"
        if [[ -f $pid_file ]]; then
            kill "$(cat "$pid_file")" 2>/dev/null || true
            rm -f "$pid_file"
        fi
    done
}

if [[ $action == stop ]]; then
    stop
    exit 0
fi
[[ $action == start ]] || { echo "usage: $0 start|stop [DIR]" >&2; exit 2; }

if ! command -v radosgw >/dev/null; then
    apt-get install -y -q --no-install-recommends radosgw ceph-mon ceph-osd ceph-common
fi
stop
rm -rf "$dir"
mkdir -p "$dir"/{log,run,mon/a,osd/0}
fsid=$(python3 -c "import uuid; print(uuid.uuid4())")
cat >"$conf" <<EOF
[global]
fsid = $fsid
keyring = $dir/keyring
mon host = 127.0.0.1:6789
mon initial members = a
auth allow insecure global id reclaim = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
osd objectstore = memstore
memstore device bytes = 17179869184
log file = $dir/log/\$name.log
admin socket = $dir/run/\$name.asok
run dir = $dir/run
pid file = $dir/run/\$name.pid
ms bind ipv6 = false
[mon.a]
mon data = $dir/mon/a
mon addr = 127.0.0.1:6789
[osd.0]
osd data = $dir/osd/0
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:7480
rgw data = $dir/rgw
rgw enable usage log = false
EOF

keyring="$dir/keyring"
ceph-authtool --create-keyring "$keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
ceph-authtool "$keyring" --gen-key -n osd.0 \
    --cap mon 'allow profile osd' --cap osd 'allow *' --cap mgr 'allow profile osd' >/dev/null
ceph-authtool "$keyring" --gen-key -n client.rgw.a --cap mon 'allow rw' --cap osd 'allow rwx' --cap mgr 'allow rw' >/dev/null

monmaptool --create --add a 127.0.0.1:6789 --fsid "$fsid" "$dir/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$keyring"
ceph-mon -c "$conf" -i a

osd_uuid=$(python3 -c "import uuid; print(uuid.uuid4())")
"${ceph_cmd[@]}" osd new "$osd_uuid" 0 >/dev/null
ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" 2>/dev/null
ceph-osd -c "$conf" -i 0 2>/dev/null
"${ceph_cmd[@]}" osd crush add osd.0 1.0 host=localhost root=default >/dev/null 2>&1

radosgw -c "$conf" -n client.rgw.a
for _ in $(seq 60); do
    curl -sf -o /dev/null http://127.0.0.1:7480/ && break
    sleep 1
done
radosgw-admin -c "$conf" user create --uid=bench --display-name=bench \
    --access-key=bench-access-key --secret=bench-secret-key >/dev/null
echo "RADOS Gateway on http://127.0.0.1:7480 (data and logs in $dir)"
