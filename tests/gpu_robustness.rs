//! GPU tests of robustness: one `Context` shared by several threads gives the bits serial use
//! gives, and a buffer larger than the device gives a typed error naming the bytes — never an
//! abort. Skip visibly without a GPU; fail under FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, Context};
use flashcore::Error;
use half::f16;

#[test]
fn too_large_a_buffer_is_a_typed_error_naming_the_bytes() {
    let Some(ctx) = gpu("too_large_a_buffer_is_a_typed_error_naming_the_bytes") else {
        return;
    };
    let len = 1usize << 50; // 2 PiB of f16
    match ctx.alloc::<f16>(len) {
        Err(Error::DeviceMemory { bytes, free, total }) => {
            assert_eq!(bytes, 2u128 << 50);
            assert!(free <= total && total > 0, "free {free} total {total}");
            let msg = Error::DeviceMemory { bytes, free, total }.to_string();
            assert!(msg.contains(&bytes.to_string()), "{msg}");
        }
        other => panic!("expected Error::DeviceMemory, got {:?}", other.map(|_| ())),
    }
    // The context is still usable afterwards.
    assert!(ctx.alloc::<f16>(1024).is_ok());
}

fn run(ctx: &Context, p: &AttentionParams, q: &[f16], k: &[f16], v: &[f16]) -> Vec<u16> {
    let (q, k, v) = upload_qkv(ctx, q, k, v);
    let mut out = ctx.alloc::<f16>(p.q_len()).unwrap();
    ctx.attention(p, &q, &k, &v, &mut out, None).unwrap();
    ctx.download(&out)
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn one_context_from_several_threads_gives_the_serial_bits() {
    let Some(ctx) = gpu("one_context_from_several_threads_gives_the_serial_bits") else {
        return;
    };
    let mut rng = rng_from(seed());
    let shapes = [
        AttentionParams::new(2, 4, 300, 64).causal(true),
        AttentionParams::new(1, 8, 1000, 128),
        AttentionParams::new(3, 2, 129, 64).seqlen_k(700),
    ];
    let inputs: Vec<_> = shapes
        .iter()
        .map(|p| {
            (
                randn::<f16>(&mut rng, p.q_len()),
                randn::<f16>(&mut rng, p.kv_len()),
                randn::<f16>(&mut rng, p.kv_len()),
            )
        })
        .collect();
    let serial: Vec<Vec<u16>> = shapes
        .iter()
        .zip(&inputs)
        .map(|(p, (q, k, v))| run(&ctx, p, q, k, v))
        .collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (ctx, shapes, inputs, serial) = (&ctx, &shapes, &inputs, &serial);
            s.spawn(move || {
                for round in 0..5 {
                    let i = (t + round) % shapes.len();
                    let (q, k, v) = &inputs[i];
                    assert!(
                        run(ctx, &shapes[i], q, k, v) == serial[i],
                        "thread {t} round {round}: bits differ from serial use"
                    );
                }
            });
        }
    });
}
