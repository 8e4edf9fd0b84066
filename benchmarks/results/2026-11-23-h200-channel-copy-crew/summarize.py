# p50 (us) of C API copy and loan, and copy / iceoryx2 of the same run, per variant and size:
#   python3 summarize.py alternated-unpinned.txt
import re, statistics, sys
runs = []
for line in open(sys.argv[1]):
    m = re.match(r'== (\S+) round', line)
    if m:
        cur = {}; runs.append((m.group(1), cur)); continue
    m = re.match(r'(\d+)\s+(C API copy|C API loan|iceoryx2)\s+([\d.]+)', line)
    if m and runs:
        runs[-1][1][(int(m.group(1)), m.group(2))] = float(m.group(3))
sizes = sorted({s for _, r in runs for s, _ in r})
print(f"{'variant':8}{'size':>10}  {'copy p50':>22}  {'loan p50':>22}  {'copy / iceoryx2':>18}")
for name in dict.fromkeys(n for n, _ in runs):
    for s in sizes:
        rs = [r for n, r in runs if n == name]
        def col(k):
            v = [r[(s, k)] for r in rs if (s, k) in r]
            return f"{statistics.median(v):9.1f} ({min(v):.0f}-{max(v):.0f})" if v else '-'
        ratio = [r[(s, 'C API copy')] / r[(s, 'iceoryx2')] for r in rs if (s, 'C API copy') in r and (s, 'iceoryx2') in r]
        rt = f"{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})" if ratio else '-'
        print(f"{name:8}{s >> 10:>8}Ki  {col('C API copy'):>22}  {col('C API loan'):>22}  {rt:>18}")
