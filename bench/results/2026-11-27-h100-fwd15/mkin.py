import json, struct, random, array, sys
def write(path, shapes, seed):
    rnd = random.Random(seed)
    blobs, header, off = [], {}, 0
    for name, shape in shapes:
        n = 1
        for s in shape: n *= s
        a = array.array('f', (rnd.gauss(0, 1) for _ in range(n)))
        u = array.array('I'); u.frombytes(a.tobytes())
        b = array.array('H', (x >> 16 for x in u)).tobytes()
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    h = json.dumps(header).encode(); h += b' ' * ((8 - len(h) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h))); f.write(h)
        for b in blobs: f.write(b)
write(sys.argv[1] + '/in64.safetensors', [(n, [1, 2048, 4, 64]) for n in 'qkv'], 1)
write(sys.argv[1] + '/in128.safetensors', [(n, [1, 1536, 4, 128]) for n in 'qkv'], 2)
