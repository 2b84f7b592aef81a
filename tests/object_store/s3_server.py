#!/usr/bin/env python3
"""moto's S3 server on 127.0.0.1, for the object-tier tests.

Prints "HOST:PORT" once it listens, then reads commands on stdin, one a line,
answering each with one line ("ok" or "error: ..."):
  bucket NAME      create bucket NAME
Exits (stopping the server) at end of input: a test that dies takes its
server with it.
"""
import logging
import os
import sys

os.environ.setdefault("S3_UPLOAD_PART_MIN_SIZE", "256")  # multipart with KiB parts
os.environ.setdefault("S3_IGNORE_SUBDOMAIN_BUCKETNAME", "true")
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

try:
    from moto.server import ThreadedMotoServer
    import boto3
except ImportError as e:  # the test that started us fails on this line
    print(f"error: moto is not installed ({e}); run tools/setup.sh --deps-only", flush=True)
    sys.exit(2)


def main():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    print(f"{host}:{port}", flush=True)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for line in sys.stdin:
        words = line.split()
        try:
            if len(words) == 2 and words[0] == "bucket":
                s3.create_bucket(Bucket=words[1])
                print("ok", flush=True)
            else:
                print(f"error: unknown command {line.strip()!r}", flush=True)
        except Exception as e:  # reported to the test, which fails
            print(f"error: {e}", flush=True)
    server.stop()


if __name__ == "__main__":
    main()
