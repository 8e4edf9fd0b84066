"""Medians of p50 and x floor per row over alternated lf-bench runs: before vs after."""
import re,sys,glob,statistics,collections
d=sys.argv[1]
data=collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(d+'/bench-*-*.txt')):
    which=re.search(r'bench-(before|after)-\d+',f).group(1)
    table=None
    for line in open(f):
        if line.startswith('# Untouched'): table='untouched'
        elif line.startswith('# Touched'): table='touched'
        elif line.startswith('# Blocking'): table='blocking'
        m=re.match(r'^(\d+)\s+C API (copy|loan|buffer send)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+([\d.]+)',line)
        if m and table:
            key=(table,int(m.group(1)),m.group(2))
            data[key][which].append((float(m.group(3)),float(m.group(5))))
def size(n):
    return f"{n//1024} KiB" if n>=1024 else f"{n} B"
print("| Case | before p50 median (runs' range), x floor median | after p50 median (runs' range), x floor median | after / before |")
print("| --- | --- | --- | --- |")
for key in sorted(data, key=lambda k:(['untouched','touched','blocking'].index(k[0]),k[1],k[2])):
    row=[]
    meds=[]
    for w in ['before','after']:
        v=data[key][w]
        if not v: row.append('-'); meds.append(None); continue
        p=[x[0] for x in v]; fl=[x[1] for x in v]
        med=statistics.median(p)
        if med<1: fmt=lambda x: f"{x*1000:.0f} ns"
        else: fmt=lambda x: f"{x:.2f} us"
        row.append(f"{fmt(med)} ({fmt(min(p))}-{fmt(max(p))}), {statistics.median(fl):.2f}x")
        meds.append(med)
    ratio = f"{meds[1]/meds[0]:.2f}" if all(meds) else '-'
    print(f"| {size(key[1])} {key[2]}, {key[0]} | {row[0]} | {row[1]} | {ratio} |")
