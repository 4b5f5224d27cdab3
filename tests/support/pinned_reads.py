"""Read a StoreLocation the way a training worker does: without the store's client."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from resources.store.base import StoreLocation


def read_location(location: StoreLocation, credentials: tuple[str, str] | None = None) -> bytes:
    """file:// is read from disk; s3:// through the endpoint in the location (lakeFS's gateway)."""
    parsed = urlparse(location.uri)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path)).read_bytes()
    if parsed.scheme != "s3":
        raise ValueError(f"unsupported location scheme in {location.uri!r}")
    if credentials is None:
        raise ValueError(f"reading {location.uri!r} needs gateway credentials (access key id, secret)")
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3", endpoint_url=location.s3_endpoint_url, region_name="us-east-1",
        aws_access_key_id=credentials[0], aws_secret_access_key=credentials[1],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2, "mode": "standard"}),
    )
    return s3.get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))["Body"].read()
