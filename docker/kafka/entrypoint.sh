#!/bin/sh
# Format the KRaft storage, then start the broker in the foreground.
set -eu
advertised="${KAFKA_ADVERTISED:-127.0.0.1:9092}"
mkdir -p /var/lib/kafka
cat > /opt/kafka/server.properties <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:9093
listeners=PLAINTEXT://0.0.0.0:9092,CONTROLLER://127.0.0.1:9093
advertised.listeners=PLAINTEXT://${advertised}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=/var/lib/kafka
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
PROPS
opts="${KAFKA_JAVA_OPTS:--Xms128m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1}"
# shellcheck disable=SC2086
java $opts -cp '/opt/kafka/libs/*' kafka.tools.StorageTool format \
    -t "${KAFKA_CLUSTER_ID:-MeIPoV_OSpO8poSTF5_OCA}" \
    -c /opt/kafka/server.properties --ignore-formatted
# shellcheck disable=SC2086
exec java $opts -cp '/opt/kafka/libs/*' kafka.Kafka /opt/kafka/server.properties
