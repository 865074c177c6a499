#!/usr/bin/env python3
"""The two halves of tests/symbol-order.sh.

  symbol-order.py sample BINARY OUT
      Until SIGTERM, records which file pages of BINARY's read-only mappings each process
      running BINARY has resident (/proc/PID/pagemap, as root), and writes, per page, how many
      processes had it.
  symbol-order.py write BINARY SAMPLE ORDER
      Writes ORDER: BINARY's functions and named constants on those pages, those most processes
      touched first, then in the order they had in BINARY.

With the device's readahead off and the binary's page cache dropped, a resident page is one the
process touched (fault-around maps only pages already cached, and with no readahead only
touched pages are). BINARY is built with every function aligned to a page, so a touched page
names one function; C code, which that alignment does not reach, is named by page.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import time

PAGE = 4096


def sample(binary, out):
    binary = os.path.realpath(binary)
    descriptor = os.open(binary, os.O_RDONLY)
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(descriptor)
    pages_of = {}
    stopped = False

    def stop(*_):
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopped:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                pages = resident_pages(int(entry), binary)
                if pages is not None:
                    pages_of.setdefault(int(entry), set()).update(pages)
        time.sleep(0.05)
    counts = {}
    for pages in pages_of.values():
        for page in pages:
            counts[page] = counts.get(page, 0) + 1
    with open(out, "w") as file:
        json.dump({"processes": len(pages_of), "pages": counts}, file)
    print(f"sampled {len(pages_of)} processes, {len(counts)} pages of {binary}")


def resident_pages(pid, binary):
    try:
        if os.readlink(f"/proc/{pid}/exe") != binary:
            return None
        with open(f"/proc/{pid}/maps") as maps:
            lines = maps.read().splitlines()
        pagemap = open(f"/proc/{pid}/pagemap", "rb")
    except OSError:
        return None
    pages = set()
    with pagemap:
        for line in lines:
            fields = line.split()
            if len(fields) < 6 or fields[5] != binary or "w" in fields[1]:
                continue
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            offset = int(fields[2], 16)
            try:
                pagemap.seek(start // PAGE * 8)
                entries = pagemap.read((end - start) // PAGE * 8)
            except OSError:
                continue
            for index in range(len(entries) // 8):
                (entry,) = struct.unpack_from("<Q", entries, index * 8)
                if entry >> 63:
                    pages.add(offset // PAGE + index)
    return pages


def write(binary, sample_file, order):
    with open(sample_file) as file:
        sampled = json.load(file)
    counts = {int(page): count for page, count in sampled["pages"].items()}
    segments = []
    headers = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True)
    for line in headers.stdout.splitlines():
        fields = line.split()
        if fields and fields[0] == "LOAD" and "W" not in " ".join(fields[6:-1]):
            segments.append((int(fields[1], 16), int(fields[2], 16), int(fields[4], 16)))
    touched = {}
    for page, count in counts.items():
        for offset, address, size in segments:
            start = max(page * PAGE, offset)
            end = min(page * PAGE + PAGE, offset + size)
            for byte in range(start, end, PAGE // 4):
                virtual_page = (byte - offset + address) // PAGE
                touched[virtual_page] = max(touched.get(virtual_page, 0), count)
    symbols = subprocess.run(
        ["nm", "-S", "--defined-only", "-n", binary], capture_output=True, text=True, check=True
    )
    chosen = []
    sizes = {"t": 0, "r": 0}
    for position, line in enumerate(symbols.stdout.splitlines()):
        fields = line.split(None, 3)
        if len(fields) != 4 or fields[2].lower() not in "tr":
            continue
        address, size, kind, name = int(fields[0], 16), int(fields[1], 16), fields[2].lower(), fields[3]
        if size == 0:
            continue
        pages = range(address // PAGE, (address + size - 1) // PAGE + 1)
        score = max((touched.get(page, 0) for page in pages), default=0)
        if score:
            chosen.append((-score, position, name))
            sizes[kind] += size
    chosen.sort()
    names = []
    seen = set()
    for _, _, name in chosen:
        if name not in seen:
            seen.add(name)
            names.append(name)
    with open(order, "w") as file:
        file.write(
            "# The symbols perch touches while it starts, connects its channels, answers and idles,\n"
            "# those the most processes touched first. Written by tests/symbol-order.sh from a dist\n"
            "# build; src/build.rs hands it to the linker. Names a build lacks are skipped.\n"
        )
        file.write("\n".join(names) + "\n")
    print(
        f"{len(names)} symbols from {sampled['processes']} processes: "
        f"functions {sizes['t'] / 2**20:.1f} MiB, constants {sizes['r'] / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "sample":
        sample(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
