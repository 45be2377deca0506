# Shared by redis.sh and sentinel.sh: who this pod is, and who the master is now.
SERVICE=bargein
HEADLESS=redis-headless
ME="$(hostname).$HEADLESS"
PASSWORD="$(cat /run/secrets/redis/password)"

# The master the Sentinels name, asking each pod's Sentinel in turn. When none answers (the first
# start of the set) redis-0 is the master; after that the Sentinels' word is the only one, so a pod
# that was the master and comes back after a failover rejoins as a replica.
find_master() {
  for i in 0 1 2; do
    host="$(timeout 3 redis-cli -h "redis-$i.$HEADLESS" -p 26379 \
      sentinel get-master-addr-by-name "$SERVICE" 2>/dev/null | head -n 1)"
    if [ -n "$host" ]; then
      echo "$host"
      return
    fi
  done
  echo "redis-0.$HEADLESS"
}
