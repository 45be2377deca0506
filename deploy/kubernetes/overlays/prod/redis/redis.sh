#!/bin/sh
# A Redis of the set: the master if the Sentinels say so (or on the very first start), else a
# replica of it. The password goes into a config file, never into the command line or environment.
set -eu
. /scripts/common.sh
MASTER="$(find_master)"
{
  echo "dir /data"
  echo "appendonly yes"
  echo "appendfsync everysec"
  echo 'save ""'
  echo "requirepass $PASSWORD"
  echo "masterauth $PASSWORD"
  echo "replica-announce-ip $ME"
  if [ "$MASTER" != "$ME" ]; then
    echo "replicaof $MASTER 6379"
  fi
} > /data/redis.conf
exec redis-server /data/redis.conf
