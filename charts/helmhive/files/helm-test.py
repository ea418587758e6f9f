"""`helm test`: the operator answers on its Services (a Service sends traffic only to ready pods).

Each URL in HELMHIVE_TEST_URLS (space-separated) must answer an HTTP request, within
HELMHIVE_TEST_TIMEOUT seconds (default 60): the metrics endpoint with 200, the webhook over TLS
with any status (the certificate is not verified here: this checks that the operator serves;
the API server checks the CA bundle). Prints what each answered; exits 1 if one did not.
"""

import os
import ssl
import sys
import time
import urllib.error
import urllib.request

TLS = ssl.create_default_context()
TLS.check_hostname = False
TLS.verify_mode = ssl.CERT_NONE


def answers(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10, context=TLS) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as err:  # an HTTP answer, even an error status, is an answer
        return f"HTTP {err.code}"


timeout = float(os.environ.get("HELMHIVE_TEST_TIMEOUT", "60"))
failed = False
for url in os.environ["HELMHIVE_TEST_URLS"].split():
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = answers(url)
            print(f"{url}: {status}", flush=True)
            failed = failed or (url.endswith("/metrics") and status != "HTTP 200")
            break
        except (OSError, urllib.error.URLError) as err:
            if time.monotonic() > deadline:
                print(f"{url}: no answer ({err})", flush=True)
                failed = True
                break
            time.sleep(2)
sys.exit(1 if failed else 0)
