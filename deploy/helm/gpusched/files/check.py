"""`helm test` check: every endpoint named in GPUSCHED_CHECK answers 200.

GPUSCHED_CHECK holds space-separated `name=url` pairs. With GPUSCHED_CHECK_EVERY_ADDRESS=1 the
host of each URL is resolved and every address it resolves to must answer (a headless Service:
one device probe per GPU node). Standard library only: it runs in gpusched's own image.
"""

import os
import socket
import sys
import urllib.parse
import urllib.request


def urls(url: str, every_address: bool) -> list[str]:
    if not every_address:
        return [url]
    parts = urllib.parse.urlsplit(url)
    infos = socket.getaddrinfo(parts.hostname, parts.port, type=socket.SOCK_STREAM)
    addresses = sorted({info[4][0] for info in infos})
    hosts = [f"[{a}]" if ":" in a else a for a in addresses]
    return [parts._replace(netloc=f"{host}:{parts.port}").geturl() for host in hosts]


def main() -> int:
    timeout = float(os.environ.get("GPUSCHED_CHECK_TIMEOUT", "10"))
    every = os.environ.get("GPUSCHED_CHECK_EVERY_ADDRESS") == "1"
    failed = 0
    for pair in os.environ["GPUSCHED_CHECK"].split():
        name, _, url = pair.partition("=")
        try:
            targets = urls(url, every)
        except OSError as err:
            print(f"FAIL {name}: {url} does not resolve ({err}); is any pod of it running?")
            failed += 1
            continue
        for target in targets:
            try:
                with urllib.request.urlopen(target, timeout=timeout) as response:
                    print(f"ok   {name}: {target} answered {response.status}")
            except OSError as err:
                print(f"FAIL {name}: {target}: {err}")
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
