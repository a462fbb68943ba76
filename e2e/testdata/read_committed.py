"""Reads a whole topic with isolation.level=read_committed, as a reader
the project did not write (confluent-kafka, on librdkafka), and prints one
JSON line per record in kcat -J's shape, until it is killed.

usage: read_committed.py BROKER TOPIC

Every partition is assigned from its beginning: no consumer group is
joined and no offset is committed, so each run reads everything that is
committed, once.
"""

import json
import sys

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition


def main():
    broker, topic = sys.argv[1], sys.argv[2]
    consumer = Consumer({
        "bootstrap.servers": broker,
        # Required by the client even though assign() joins no group.
        "group.id": "outbox-e2e-read-committed",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "isolation.level": "read_committed",
    })
    meta = consumer.list_topics(topic, timeout=30)
    found = meta.topics.get(topic)
    if found is None or found.error is not None:
        sys.exit("topic %s: %s" % (topic, found.error if found else "not in metadata"))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(found.partitions)])
    while True:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            raise KafkaException(msg.error())
        headers = []
        for k, v in msg.headers() or []:
            headers += [k, (v or b"").decode("utf-8", "replace")]
        key = msg.key()
        print(json.dumps({
            "topic": msg.topic(),
            "partition": msg.partition(),
            "offset": msg.offset(),
            "ts": msg.timestamp()[1],
            "headers": headers,
            "key": None if key is None else key.decode("utf-8", "replace"),
        }), flush=True)


if __name__ == "__main__":
    main()
