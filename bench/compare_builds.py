"""compare_builds.py OUT ROUNDS BENCH... - new/old ratios of the tables that
bench/compare_builds.sh collected (see there). Times: best = min; rates
(bench_decode's tokens/s): best = max. A ratio above 1 is slower for times,
faster for rates; the header of each line says which."""
import json
import re
import statistics
import sys


def attn(path):  # rows: ctx n_q variant warm_us cold_us ...
    out = {}
    for ln in open(path):
        m = re.match(r'\s+(\d+)\s+(\d+)\s+(.+?)\s{2,}([\d.]+)\s+([\d.]+)\s', ln)
        if m:
            out[(m[1], m[2], m[3].strip())] = [float(m[4]), float(m[5])]
    return out


def encode(path):  # rows: type bytes and seven ns columns
    out = {}
    for ln in open(path):
        m = re.match(r'(\w+)\s+\d+((?:\s+[\d.]+){7})\s*$', ln)
        if m:
            out[m[1]] = [float(x) for x in m[2].split()]
    return out


def rotation(path):  # the apply-time table: kind dim apply apply_t apply_ref apply_t_ref (ns)
    out = {}
    for ln in open(path):
        if ln.startswith('rotation quality'):
            break
        m = re.match(r'([\w-]+)\s+(\d+)((?:\s+[\d.]+){4})\s+[\d.]+\s*$', ln)
        if m:
            out[(m[1], m[2])] = [float(x) for x in m[3].split()]
    return out


def decode(path):  # rows: ctx cache prefill decode spec4 (tokens/s)
    out = {}
    for ln in open(path):
        m = re.match(r'\s+(\d+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)', ln)
        if m:
            out[(m[1], m[2])] = [float(m[3]), float(m[4]), float(m[5])]
    return out


def cuda(path):  # bench_cuda.json: results[].us
    d = json.load(open(path.replace('bench_cuda.txt', 'bench_cuda.json')))
    out = {}
    for e in d.get('results', []):
        if isinstance(e, dict) and 'us' in e:
            out[(e.get('batch'), e.get('context'), e.get('type_k'), e.get('type_v'))] = [e['us']]
    return out


PARSE = {'bench_attn': (attn, min, 'us'), 'bench_encode': (encode, min, 'ns'),
         'bench_rotation': (rotation, min, 'ns'), 'bench_decode': (decode, max, 'tokens/s'),
         'bench_cuda': (cuda, min, 'us')}

out, rounds, benches = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for b in benches:
    parse, best, unit = PARSE[b]
    runs = {v: [parse(f'{out}/{v}{r}/{b}.txt') for r in range(1, rounds + 1)] for v in ('old', 'new')}
    ratios = []
    for k, vals in runs['old'][0].items():
        if not all(k in t for v in runs for t in runs[v]):
            continue
        for i in range(len(vals)):
            o = best(t[k][i] for t in runs['old'])
            n = best(t[k][i] for t in runs['new'])
            if o > 0:
                ratios.append(n / o)
    if not ratios:
        print(f'{b}: no comparable rows')
        continue
    ratios.sort()
    print(f'{b}: {len(ratios)} numbers ({unit}), best of {rounds}, new/old median {statistics.median(ratios):.3f}, '
          f'10-90% {ratios[len(ratios) // 10]:.3f}-{ratios[9 * len(ratios) // 10]:.3f}')
