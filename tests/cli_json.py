#!/usr/bin/env python3
"""The CLI's JSON (info, topo, ls) is valid UTF-8 JSON that carries
"schema": 1, whatever bytes it prints: quotes, control characters and
invalid UTF-8 in a setting's value, in an unknown GPUIPC_* name and in the
runtime directory's path come back as the documented rule says (control
characters as \\u00XX, valid UTF-8 as it is, each byte of an invalid
sequence as U+FFFD).

`info` (text and JSON) also says what the build included, as CMake tells
this test (cuda=0|1: the CUDA header; mpi=VERSION or empty: the MPI
component), and plain `info` shows the settings set, rejected or unknown.
Every command that takes --json prints one JSON object with an "error"
member when it fails. `info` lists every kind of gpuipc.h's list but auto,
and `bench --kind` takes each name.

`bench --json`: each copy size has 5 runs a side, gpuipc's and the
baseline's alternated (each run starts after the other side's last one),
its medians and spread agree with the runs; HOST has no kernel round trip;
on the fake driver (fake=PATH, when built) each GPU path has the three
kernel rows, and where the driver cannot launch kernels none, and the
document says why. Every path has the three block rows (16 KiB blocks,
one a round under --max-bytes 64 KiB), and the paths with kernel rows
the kernel floor too, whose median, spread and ratios agree with their
rounds.

usage: cli_json.py GPUIPC_CLI SCRATCH_DIR cuda=0|1 mpi=[VERSION] [fake=PATH]
"""
import json
import os
import re
import shutil
import subprocess
import sys

cli, scratch = sys.argv[1], sys.argv[2]
built = dict(a.split('=', 1) for a in sys.argv[3:6])
failures = 0

# Quotes, a backslash, control characters, valid 2-, 3- and 4-byte UTF-8,
# and invalid bytes: a lone continuation byte, 0xff, a 2-byte lead cut
# short, an overlong '/', and an encoded surrogate.
NASTY = (b'q"uo\\te\x01\x1f\x7f\n\t \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 '
         b'\x80 \xff \xc3( \xc0\xaf \xed\xa0\x80 end')


def expect(b):
    """What the JSON string decodes to: Python's own replacement gives one
    U+FFFD per byte for each of the invalid sequences above."""
    return b.decode('utf-8', 'replace')


def fail(what):
    global failures
    failures += 1
    print('FAIL: ' + what)


def run(args, env_extra, want_rc=None):
    env = {k: v for k, v in os.environb.items()
           if not k.startswith(b'GPUIPC_') and not k.startswith(b'FAKE_CUDA_')}
    env.update(env_extra)
    p = subprocess.run([cli] + args, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    what = 'gpuipc ' + ' '.join(args)
    if want_rc is not None and p.returncode != want_rc:
        fail('%s exited %d, expected %d; stderr: %r'
             % (what, p.returncode, want_rc, p.stderr))
    try:
        text = p.stdout.decode('utf-8')  # strict: no raw invalid bytes
    except UnicodeDecodeError as e:
        fail('%s printed invalid UTF-8: %s\n%r' % (what, e, p.stdout))
        return None
    try:
        doc = json.loads(text)  # strict: no raw control characters
    except ValueError as e:
        fail('%s printed invalid JSON: %s\n%s' % (what, e, text))
        return None
    if doc.get('schema') != 1:
        fail('%s: "schema" is %r, expected 1' % (what, doc.get('schema')))
    print('%s: valid JSON, schema %r' % (what, doc.get('schema')))
    return doc


# A runtime directory whose path has every kind of byte in it.
rundir = os.path.join(os.fsencode(scratch), b'dir ' + NASTY)
shutil.rmtree(os.fsencode(scratch), ignore_errors=True)
os.makedirs(rundir, mode=0o700)
os.chmod(rundir, 0o700)

# info --config --json: a setting's value, and an unknown name.
unknown = b'GPUIPC_X' + NASTY.replace(b'=', b'_')
doc = run(['info', '--config', '--json'],
          {b'GPUIPC_CUDA_LIB': NASTY, unknown: b'1'}, 0)
if doc is not None:
    got = doc['config']['GPUIPC_CUDA_LIB']['value']
    if got != expect(NASTY):
        fail('GPUIPC_CUDA_LIB came back as %r, expected %r'
             % (got, expect(NASTY)))
    if expect(unknown) not in doc.get('unknown_settings', []):
        fail('unknown_settings %r lacks %r'
             % (doc.get('unknown_settings'), expect(unknown)))

# A malformed value: the default is in force, the value shows as rejected.
doc = run(['info', '--config', '--json'], {b'GPUIPC_TIMEOUT_MS': b'ab"c\x01'},
          0)
if doc is not None:
    t = doc['config']['GPUIPC_TIMEOUT_MS']
    if t['value'] != '10000' or t['rejected'] != 'ab"c\x01' or not t['problem']:
        fail('GPUIPC_TIMEOUT_MS=ab"c\\x01 shows as %r' % t)

# A member limit that does not parse ("lots") is rejected, not in force.
doc = run(['info', '--config', '--json'], {b'GPUIPC_MAX_MEMBERS': b'lots'}, 0)
if doc is not None:
    t = doc['config']['GPUIPC_MAX_MEMBERS']
    if t['value'] != '0' or t['rejected'] != 'lots' or not t['problem']:
        fail('GPUIPC_MAX_MEMBERS=lots shows as %r' % t)

# info --json: everything, the driver's sentence naming the library included.
doc = run(['info', '--json'], {b'GPUIPC_CUDA_LIB': NASTY}, 0)
if doc is not None and doc['config']['GPUIPC_CUDA_LIB']['value'] != expect(NASTY):
    fail('info --json: GPUIPC_CUDA_LIB is %r'
         % doc['config']['GPUIPC_CUDA_LIB']['value'])

# What the build included, as CMake says.
doc = run(['info', '--json'], {}, 0)
if doc is not None:
    b = doc.get('build') or {}
    want = {'cuda_header': built['cuda'] == '1', 'mpi': built['mpi'] != '',
            'mpi_version': built['mpi'] or None}
    got = {k: b.get(k) for k in want}
    if got != want:
        fail('info --json: build %r, expected %r' % (b, want))
    if want['cuda_header'] != isinstance(b.get('cuda_header_version'), int):
        fail('info --json: cuda_header_version %r' % b.get('cuda_header_version'))
    if not isinstance(b.get('nvml_loaded'), bool) or not b.get('compiler'):
        fail('info --json: build %r lacks nvml_loaded or compiler' % b)


def run_text(args, env_extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith('GPUIPC_') and not k.startswith('FAKE_CUDA_')}
    env.update(env_extra)
    p = subprocess.run([cli] + args, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60, text=True)
    if p.returncode != 0:
        fail('gpuipc %s exited %d: %s' % (' '.join(args), p.returncode, p.stderr))
    return p.stdout


# Plain info: the build, and the settings set, rejected and unknown.
out = run_text(['info'], {'GPUIPC_TIMEOUT_MS': '5', 'GPUIPC_MAX_MEMBERS': 'lots',
                          'GPUIPC_NO_SUCH': '1'})
for needle in ('build:', 'CUDA header' if built['cuda'] == '1' else 'no CUDA header',
               'MPI component (libgpuipc_mpi) built, MPI ' + built['mpi']
               if built['mpi'] else 'no MPI component', 'NVML',
               'GPUIPC_TIMEOUT_MS="5"', 'GPUIPC_MAX_MEMBERS="lots"  REJECTED',
               'GPUIPC_NO_SUCH  UNKNOWN', 'gpuipc info --config'):
    if needle not in out:
        fail('gpuipc info does not say %r:\n%s' % (needle, out))

# topo --json without a driver: the reason names the library (or, in a
# build without CUDA headers, says so).
doc = run(['topo', '--json'], {b'GPUIPC_CUDA_LIB': NASTY})
why = expect(NASTY) if built['cuda'] == '1' else 'without CUDA headers'
if doc is not None and why not in (doc.get('error') or ''):
    fail('topo --json: error %r does not say %r' % (doc.get('error'), why))

# ls --json in that runtime directory.
doc = run(['ls', '--json'], {b'GPUIPC_DIR': rundir}, 0)
if doc is not None and doc.get('runtime_dir') != expect(rundir):
    fail('ls --json: runtime_dir %r, expected %r'
         % (doc.get('runtime_dir'), expect(rundir)))


# Failures under --json are one JSON object too, with an "error" member.
def expect_error(args, env_extra, want_rc, mentions):
    doc = run(args, env_extra, want_rc)
    if doc is not None and mentions not in (doc.get('error') or ''):
        fail('gpuipc %s: error %r does not mention %r'
             % (' '.join(args), doc.get('error'), mentions))


plain = os.path.join(os.fsencode(scratch), b'plain')
os.makedirs(plain, mode=0o700)
os.chmod(plain, 0o700)
# a domain nobody serves
expect_error(['ls', '--json', 'nobody'], {b'GPUIPC_DIR': plain}, 1, 'nobody')
# a runtime directory others may write: refused
unsafe = os.path.join(os.fsencode(scratch), b'unsafe')
os.makedirs(unsafe)
os.chmod(unsafe, 0o777)
expect_error(['ls', '--json'], {b'GPUIPC_DIR': unsafe}, 1, 'unsafe')
# a bad command line
expect_error(['ls', '--json', '--sideways'], {b'GPUIPC_DIR': plain}, 2,
             '--sideways')
expect_error(['info', '--json', '--sideways'], {}, 2, '--sideways')
# a kind that is not here
expect_error(['bench', '--json', '--quick', '--max-bytes', '4096', '--kind',
              'vmm'], {b'GPUIPC_NO_CUDA': b'1', b'GPUIPC_DIR': plain}, 1,
             'vmm')

# The kinds: gpuipc.h's list (GPUIPC_KIND_MAP), which `info` lists (all but
# auto, a request) and `bench --kind` takes (the name accepted, the
# command line then refused at the argument after it).
HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                      'include', 'gpuipc.h')
with open(HEADER) as f:
    kind_map = re.search(r'#define GPUIPC_KIND_MAP\(XX\)(.*?)\n\n', f.read(),
                         re.S)
kinds = re.findall(r'XX\(\w+, \d+, "(\w+)"', kind_map.group(1) if kind_map else '')
if len(kinds) < 2 or kinds[0] != 'auto':
    fail('no kinds found in %s: %r' % (HEADER, kinds))
doc = run(['info', '--json'], {}, 0)
if doc is not None and list(doc.get('kinds') or {}) != kinds[1:]:
    fail('info --json: kinds %r, expected %r' % (list(doc.get('kinds') or {}),
                                                kinds[1:]))
for k in kinds:
    expect_error(['bench', '--json', '--kind', k, '--sideways'], {}, 2,
                 '--sideways')



def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def close(a, b):
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b)) + 1e-9


def check_bw_row(what, r):
    g, b = r.get('gpuipc_gbs_runs') or [], r.get('baseline_gbs_runs') or []
    gt, bt = r.get('gpuipc_run_start_us') or [], r.get('baseline_run_start_us') or []
    if not r.get('runs', 0) >= 5 or not len(g) == len(b) == len(gt) == len(bt) == r['runs']:
        fail('%s: %d bytes: runs %r, %d/%d samples, %d/%d starts'
             % (what, r['bytes'], r.get('runs'), len(g), len(b), len(gt), len(bt)))
        return
    starts = [t for pair in zip(gt, bt) for t in pair]
    if starts != sorted(starts) or len(set(starts)) != len(starts):
        fail('%s: %d bytes: runs not alternated: gpuipc at %r, baseline at %r'
             % (what, r['bytes'], gt, bt))
    if not all(x > 0 for x in g + b):
        fail('%s: %d bytes: a run of no speed: %r %r' % (what, r['bytes'], g, b))
    want = {'gpuipc_gbs': median(g), 'baseline_gbs': median(b),
            'gpuipc_gbs_min': min(g), 'gpuipc_gbs_max': max(g),
            'baseline_gbs_min': min(b), 'baseline_gbs_max': max(b),
            'ratio': median(g) / median(b)}
    for k, v in want.items():
        if not close(r.get(k, -1), v):
            fail('%s: %d bytes: %s is %r, the runs say %r'
                 % (what, r['bytes'], k, r.get(k), v))


BLOCK_ROWS = ('blocks_gpuipc', 'blocks_per_message', 'blocks_floor')


def check_blocks(what, doc, paths, kernel_paths):
    rows = doc.get('blocks', [])
    got = sorted((r['src'], r['dst'], r['row']) for r in rows)
    want = sorted([(s, d, n) for s, d in paths for n in BLOCK_ROWS] +
                  [(s, d, 'blocks_floor_kernel') for s, d in kernel_paths])
    if got != want:
        fail('%s: blocks rows %r, expected %r' % (what, got, want))
    by = {(r['src'], r['dst'], r['row']): r for r in rows}
    for r in rows:
        us = r.get('us_runs') or []
        if not (r['block_bytes'] == 16384 and r['n'] == 1 and r['runs'] == 5
                and len(us) == 5 and all(x > 0 for x in us)):
            fail('%s: blocks row %r' % (what, r))
            continue
        want = {'median_us': median(us), 'min_us': min(us), 'max_us': max(us),
                'gbs': r['block_bytes'] * r['n'] / median(us) / 1e3}
        if r['row'] == 'blocks_gpuipc':
            key = (r['src'], r['dst'])
            want['ratio_floor'] = median(us) / by[key + ('blocks_floor',)]['median_us']
            if key in kernel_paths:
                want['ratio_floor_kernel'] = (
                    median(us) / by[key + ('blocks_floor_kernel',)]['median_us'])
            elif 'ratio_floor_kernel' in r:
                fail('%s: %r has ratio_floor_kernel' % (what, r))
            want['ratio_per_message'] = (by[key + ('blocks_per_message',)]['median_us']
                                         / median(us))
        for k, v in want.items():
            if not close(r.get(k, -1), v):
                fail('%s: blocks row %s: %s is %r, the rounds say %r'
                     % (what, r['row'], k, r.get(k), v))


def check_bench(what, env_extra, args, kloop_paths, paths=((0, 0),)):
    doc = run(['bench', '--json', '--quick', '--max-bytes', '65536'] + args,
              env_extra, 0)
    if doc is None:
        return
    if doc.get('runs') != 5 or len(doc.get('bandwidth', [])) != 3:
        fail('%s: runs %r, %d bandwidth rows' % (what, doc.get('runs'),
                                                 len(doc.get('bandwidth', []))))
    for r in doc.get('bandwidth', []):
        check_bw_row(what, r)
    rows = sorted((r['src'], r['dst'], r['row']) for r in doc.get('kloop', []))
    want = sorted((s, d, n) for s, d in kloop_paths for n in
                  ('kloop_gpuipc', 'kloop_one_process', 'kloop_floor_word'))
    if rows != want:
        fail('%s: kloop rows %r, expected %r' % (what, rows, want))
    for r in doc.get('kloop', []):
        if not (r['n'] > 0 and r['median_us'] > 0 and r['p99_us'] >= r['median_us']
                and r['bytes'] == 4096):
            fail('%s: kloop row %r' % (what, r))
    check_blocks(what, doc, paths, kloop_paths)
    return doc


check_bench('bench on HOST', {b'GPUIPC_NO_CUDA': b'1', b'GPUIPC_DIR': plain},
            [], [], [(-1, -1)])
if built.get('fake'):
    check_bench('bench on the fake driver',
                {b'GPUIPC_CUDA_LIB': os.fsencode(built['fake']),
                 b'FAKE_CUDA_NDEV': b'1', b'GPUIPC_DIR': plain},
                ['--kind', 'legacy'], [(0, 0)])
    # A driver that cannot launch kernels: no kernel rows, and why.
    doc = check_bench('bench on a fake driver without cuLaunchKernel',
                      {b'GPUIPC_CUDA_LIB': os.fsencode(built['fake']),
                       b'FAKE_CUDA_NDEV': b'1', b'GPUIPC_DIR': plain,
                       b'FAKE_CUDA_HIDE': b'cuLaunchKernel'},
                      ['--kind', 'legacy'], [])
    if doc is not None and 'cannot launch kernels' not in doc.get('kloop_skipped', ''):
        fail('bench without cuLaunchKernel: kloop_skipped %r'
             % doc.get('kloop_skipped'))

shutil.rmtree(os.fsencode(scratch), ignore_errors=True)
if failures:
    print('%d failure(s)' % failures)
    sys.exit(1)
print('cli_json: all passed')
