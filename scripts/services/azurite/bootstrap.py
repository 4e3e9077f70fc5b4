"""Prepare a fresh Azurite for strata's tests: the container `strata-test` of the emulator's
well-known account, created with a Shared Key request (standard library only: the account
and key are Azurite's documented defaults, not secrets).

    python3 bootstrap.py http://127.0.0.1:PORT CONTAINER"""

import base64
import hashlib
import hmac
import sys
import urllib.error
import urllib.request
from email.utils import formatdate

ACCOUNT = "devstoreaccount1"
KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")
VERSION = "2021-08-06"


def create_container(endpoint: str, container: str) -> None:
    date = formatdate(usegmt=True)
    headers = {"x-ms-date": date, "x-ms-version": VERSION}
    canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
    resource = f"/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container"
    # VERB, then 11 standard headers (all empty here: no body, the date is x-ms-date).
    to_sign = "PUT\n" + "\n" * 11 + canonical_headers + resource
    signature = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(),
                                          hashlib.sha256).digest()).decode()
    request = urllib.request.Request(
        f"{endpoint}/{ACCOUNT}/{container}?restype=container", method="PUT",
        headers={**headers, "Authorization": f"SharedKey {ACCOUNT}:{signature}",
                 "Content-Length": "0"})
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as e:
        if e.code != 409:  # 409: it exists already
            raise SystemExit(f"creating container {container}: HTTP {e.code}: {e.read()[:300]!r}")


if __name__ == "__main__":
    create_container(sys.argv[1], sys.argv[2])
