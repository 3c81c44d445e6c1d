"""A consumer process for tests that kill consumers: ``python -m tests.integration.consumer_worker``.

It subscribes with the official client and appends one line per event to its output
file, flushed at once, so that what it did is known even after SIGKILL:
    R <payload>     received
    A <payload>     acknowledged (the ack was handed to the client)
    S <json>        started (subscribed)
With ``--hold N`` it acknowledges nothing after its first N messages and just keeps
receiving (it is meant to be killed holding them). It stops after ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import pulsar

MODES = {"shared": pulsar.ConsumerType.Shared, "failover": pulsar.ConsumerType.Failover,
         "exclusive": pulsar.ConsumerType.Exclusive, "key_shared": pulsar.ConsumerType.KeyShared}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--service-url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--subscription", required=True)
    parser.add_argument("--mode", choices=sorted(MODES), default="shared")
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--hold", type=int, default=-1, help="stop acknowledging after this many")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--receiver-queue", type=int, default=1000)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="pause per message")
    args = parser.parse_args()
    client = pulsar.Client(args.service_url, operation_timeout_seconds=30)
    consumer = client.subscribe(args.topic, args.subscription, consumer_type=MODES[args.mode],
                                consumer_name=args.name, receiver_queue_size=args.receiver_queue,
                                initial_position=pulsar.InitialPosition.Earliest)
    with open(args.out, "a", buffering=1) as out:
        out.write("S " + json.dumps({"pid": os.getpid(), "name": args.name}) + "\n")
        received = 0
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                continue
            payload = message.data().decode()
            out.write(f"R {payload}\n")
            received += 1
            if args.delay_ms:
                time.sleep(args.delay_ms / 1000)
            if args.hold >= 0 and received > args.hold:
                continue
            consumer.acknowledge(message)
            out.write(f"A {payload}\n")
    client.close()


if __name__ == "__main__":
    main()
