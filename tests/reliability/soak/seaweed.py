"""SeaweedFS for the soak, which restarts it again and again (the S3 fault).

tests/support/seaweed.py's readiness check looks for its bucket with ListBuckets and creates it
when absent. SeaweedFS 4.48 without an identity configuration lists no bucket at all, so after a
restart on the same data the check creates the bucket again, is answered
BucketAlreadyOwnedByYou, and gives up after 90 s. Here existence is asked with HeadBucket."""

from __future__ import annotations

import time

from tests.support.seaweed import READY_TIMEOUT_S, SeaweedServer


class RestartableSeaweed(SeaweedServer):
    def _wait_until_writable(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + READY_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}: {self.log_tail()}")
            try:
                s3 = self.client()
                try:
                    s3.head_bucket(Bucket=self.bucket)
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                        raise
                    s3.create_bucket(Bucket=self.bucket)
                s3.put_object(Bucket=self.bucket, Key=".probe", Body=b"ok")
                s3.delete_object(Bucket=self.bucket, Key=".probe")
                return
            except (BotoCoreError, ClientError) as exc:
                last_error = exc
                time.sleep(0.25)
        raise RuntimeError(f"SeaweedFS did not accept writes within {READY_TIMEOUT_S}s (last error: {last_error}); "
                           f"log tail: {self.log_tail()}")
