# Per-run and median ratios to pinned cudaMemcpy of the staged rows in a matrix file:
#   python3 summarize.py matrix-3-alternated.txt
import re,statistics,sys
cur=None; runs=[]
for line in open(sys.argv[1]):
    m=re.match(r'== (\S+)',line)
    if m:
        cur={}; runs.append((m.group(1),cur)); size=None; continue
    m=re.match(r'\s+(\d+ MiB):',line)
    if m: size=m.group(1); continue
    m=re.search(r'(write from|read into) a Vec.*?\s([\d.]+)\s+([\d.]+)x pinned',line)
    if m: cur[(size,m.group(1)[:2])]=float(m.group(3))
keys=[(s,d) for s in ['1 MiB','16 MiB','256 MiB'] for d in ['wr','re']]
print('name   '+'  '.join(f'{s[:-4]:>4}{d}' for s,d in keys))
for n,r in runs: print(f'{n:7}'+'  '.join(f'{r.get(k,0):6.2f}' for k in keys))
print('medians (min-max)')
names=[]
for n,_ in runs:
    if n not in names: names.append(n)
for name in names:
    vals=lambda k:[r[k] for n,r in runs if n==name]
    print(f'{name:7}'+'  '.join(f'{statistics.median(vals(k)):.2f}({min(vals(k)):.2f}-{max(vals(k)):.2f})' for k in keys))
