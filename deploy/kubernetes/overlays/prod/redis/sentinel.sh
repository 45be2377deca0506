#!/bin/sh
# The Sentinel beside each Redis: three of them, two must agree that the master is down before one
# promotes a replica. Sentinel rewrites its own file, so it lives on a writable volume.
set -eu
. /scripts/common.sh
MASTER="$(find_master)"
mkdir -p /sentinel
cat > /sentinel/sentinel.conf <<CONF
port 26379
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $ME
sentinel monitor $SERVICE $MASTER 6379 2
sentinel auth-pass $SERVICE $PASSWORD
sentinel down-after-milliseconds $SERVICE 5000
sentinel failover-timeout $SERVICE 60000
sentinel parallel-syncs $SERVICE 1
CONF
exec redis-server /sentinel/sentinel.conf --sentinel
