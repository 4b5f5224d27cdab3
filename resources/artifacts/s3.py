"""Artifacts in S3 (or any S3-compatible server) through boto3.

Large files go up as multipart uploads, which S3 publishes only on completion, so readers
never see a partial object. Transient failures (5xx, throttling, connection resets, timeouts)
are retried by botocore's "standard" mode with exponential backoff and jitter, a bounded number
of times; then the call fails with an ArtifactError that names the endpoint and what to check.

A refusal names the key (its id, never its secret), the permission it lacks and where; given the
key's ``scope`` (resources/artifacts/key_scope.py), also where that key may act instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from resources.artifacts.base import ArtifactError, ArtifactStore, validate_key
from resources.artifacts.key_scope import LIST, READ, WRITE, KeyScope
from training_runtime.atomic_files import atomic_path

MIB = 1024 * 1024
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
# HEAD answers carry no body, so a refused HEAD has only its status as the code.
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled"}


class S3ArtifactStore(ArtifactStore):
    """``s3://<bucket>/<prefix>/<key>``. Credentials come from ``session`` or explicit keys,
    else from boto3's default chain (environment, config files, instance role)."""

    def __init__(
        self, bucket: str, prefix: str = "", endpoint_url: str | None = None,
        region: str | None = None, *, session: boto3.Session | None = None,
        access_key_id: str | None = None, secret_access_key: str | None = None,
        max_attempts: int = 5, connect_timeout_s: float = 5.0, read_timeout_s: float = 60.0,
        multipart_threshold_bytes: int = 64 * MIB, multipart_chunk_bytes: int = 16 * MIB,
        addressing_style: str = "auto", scope: KeyScope | None = None,
    ):
        if not bucket:
            raise ArtifactError("S3ArtifactStore needs a bucket name")
        if (access_key_id is None) != (secret_access_key is None):
            raise ArtifactError("give both access_key_id and secret_access_key, or neither (to use boto3's default chain)")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        self.max_attempts = max_attempts
        self.scope = scope
        self._access_key_id = access_key_id
        config = Config(
            region_name=region,
            retries={"total_max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout_s, read_timeout=read_timeout_s,
            s3={"addressing_style": addressing_style},
        )
        session = session or boto3.Session()
        self._session = session
        # The secret goes straight into botocore's credential object; this class keeps no copy.
        self._client = session.client(
            "s3", endpoint_url=endpoint_url, config=config,
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
        )
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold_bytes, multipart_chunksize=multipart_chunk_bytes,
            use_threads=True, max_concurrency=4,
        )

    def __repr__(self) -> str:
        return (f"S3ArtifactStore(bucket={self.bucket!r}, prefix={self.prefix!r}, "
                f"endpoint_url={self.endpoint_url!r}, region={self.region!r})")

    def _object_key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, action: str, key: str, exc: Exception, permission: str | None = None) -> ArtifactError:
        where = f"s3://{self.bucket}/" + "/".join(p for p in (self.prefix, key) if p)
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "?")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
            if code in _DENIED:
                return ArtifactError(self._denied(permission or action, where, code, status))
            hint = {
                "NoSuchBucket": f"create bucket {self.bucket!r} first",
                "InvalidAccessKeyId": f"the server knows no access key {self._key_id()}; check the access key id",
                "SignatureDoesNotMatch": "check the secret access key",
            }.get(code, f"the server answered HTTP {status}")
            message = f"{action} {where} failed: {code} ({hint})"
            if str(status).startswith("5"):
                message += f" after {self.max_attempts} attempts; the S3 server is failing, retry later"
        else:
            # Connection errors and timeouts carry only the endpoint, never credentials.
            message = (f"{action} {where} failed after {self.max_attempts} attempts: "
                       f"{type(exc).__name__}: {exc}; check that {self.endpoint_url or 'S3'} is reachable")
        return ArtifactError(message)

    def _denied(self, permission: str, where: str, code: str, status: object) -> str:
        message = f"access denied: key {self._key_id()} may not {permission} {where} (the server answered {code}, HTTP {status})"
        if self.scope is not None and permission in (READ, WRITE, LIST):
            return f"{message}; {self.scope.explain(permission)}"
        return f"{message}; grant this key {permission} on that prefix (the bucket policy or the key's IAM policy), " \
               "or use the key that holds it"

    def _key_id(self) -> str:
        """The access key id (not a secret: S3 logs it with every request), for messages."""
        if self._access_key_id:
            return self._access_key_id
        credentials = self._session.get_credentials()
        return credentials.access_key if credentials is not None else "(none: no credentials found)"

    def put_file(self, local_path: Path, key: str) -> str:
        object_key = self._object_key(key)
        local_path = Path(local_path)
        if not local_path.is_file():
            raise ArtifactError(f"cannot upload {local_path}: it is not a readable file")
        try:
            self._client.upload_file(str(local_path), self.bucket, object_key, Config=self._transfer)
        except S3UploadFailedError as exc:
            # boto3 wraps the ClientError it caught; report the original code and status.
            raise self._fail("upload to", key, exc.__context__ or exc, WRITE) from None
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("upload to", key, exc, WRITE) from None
        return self.uri(key)

    def get_file(self, key: str, dest: Path) -> Path:
        object_key = self._object_key(key)
        dest = Path(dest)
        try:
            with atomic_path(dest) as tmp:  # readers of dest see the old file or the whole download
                self._client.download_file(self.bucket, object_key, str(tmp), Config=self._transfer)
        except (BotoCoreError, ClientError, RetriesExceededError) as exc:
            if self._is_not_found(exc):
                raise ArtifactError(f"artifact {key!r} not found at {self.uri(key)}") from None
            raise self._fail("download of", key, exc, READ) from None
        return dest

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._object_key(key))
        except ClientError as exc:
            if self._is_not_found(exc):
                return False
            raise self._fail("lookup of", key, exc, READ) from None
        except BotoCoreError as exc:
            raise self._fail("lookup of", key, exc, READ) from None
        return True

    def list_keys(self, prefix: str = "") -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root + prefix)
            for page in pages:
                keys.extend(obj["Key"][len(root):] for obj in page.get("Contents", []))
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("listing of", prefix, exc, LIST) from None
        return sorted(keys)

    def delete(self, key: str) -> None:
        if not self.exists(key):
            raise ArtifactError(f"cannot delete artifact {key!r}: not found at {self.uri(key)}")
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._object_key(key))
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("delete of", key, exc, WRITE) from None

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._object_key(key)}"

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing (local S3 servers and first deployments)."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            # Some servers answer 403 for a missing bucket; creating it then either works or
            # fails with an error that says the name is taken.
            if exc.response.get("Error", {}).get("Code") not in {*_NOT_FOUND, "NoSuchBucket", "403", "AccessDenied"}:
                raise self._fail("lookup of bucket", "", exc, "look up buckets") from None
        except BotoCoreError as exc:
            raise self._fail("lookup of bucket", "", exc, "look up buckets") from None
        try:
            kwargs: dict[str, Any] = {"Bucket": self.bucket}
            if self.region and self.region != "us-east-1":
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
            self._client.create_bucket(**kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("creation of bucket", "", exc, "create buckets") from None

    @staticmethod
    def _is_not_found(exc: Exception) -> bool:
        return isinstance(exc, ClientError) and str(exc.response.get("Error", {}).get("Code")) in _NOT_FOUND
