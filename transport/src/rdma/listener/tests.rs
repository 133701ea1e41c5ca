use super::*;

const CAPS: DeviceCaps = DeviceCaps {
    max_qp_wr: 16384,
    max_cqe: 32768,
    max_sge: 32,
    max_qp_init_rd_atom: 128,
    max_qp_rd_atom: 128,
    max_srq_wr: 16384,
};

fn params() -> RdmaParams {
    RdmaParams {
        port_id: 2,
        in_capsule_data_size: 8192,
        max_data_transfer: 1 << 20,
        max_queue_entries: 128,
        max_io_queues: 8,
        capsule_buffers: 1024,
        response_buffers: 2048,
        data_buffers: 64,
        shared_receive_queue: false,
    }
}

fn conn(initiator_depth: u8) -> verbs::ConnParams {
    verbs::ConnParams {
        private_data: Vec::new(),
        initiator_depth,
        responder_resources: 0,
    }
}

#[test]
fn shape_caps_ord_by_device_and_sizes_queues() {
    let s = shape_for(128, &conn(200), &CAPS, &params()).unwrap();
    assert_eq!((s.depth, s.contexts, s.ord), (128, 256, 128));
    let (cqe, qp) = queue_sizes(&s);
    assert_eq!((qp.max_send_wr, qp.max_recv_wr, cqe), (512, 128, 640));
    assert_eq!(shape_for(32, &conn(16), &CAPS, &params()).unwrap().ord, 16);
}

#[test]
fn shape_refuses_zero_ord_and_oversized_queues() {
    assert_eq!(
        shape_for(32, &conn(0), &CAPS, &params()),
        Err(CmRejectStatus::InvalidOrd)
    );
    let small = DeviceCaps {
        max_qp_wr: 100,
        ..CAPS
    };
    assert_eq!(
        shape_for(128, &conn(4), &small, &params()),
        Err(CmRejectStatus::NoResources)
    );
}

#[test]
fn pools_are_split_over_reactors_but_keep_one_full_queue() {
    let p = params();
    let one = p.pool_params(1);
    assert_eq!(
        (one.capsule_buffers, one.response_buffers, one.data_buffers),
        (1024, 2048, 64)
    );
    let two = p.pool_params(2);
    assert_eq!(
        (two.capsule_buffers, two.response_buffers, two.data_buffers),
        (512, 1024, 32)
    );
    // Rounded up, never below one queue of 128 entries (256 responses), one data buffer.
    let many = p.pool_params(64);
    assert_eq!(
        (
            many.capsule_buffers,
            many.response_buffers,
            many.data_buffers
        ),
        (128, 256, 1)
    );
    let odd = RdmaParams {
        capsule_buffers: 301,
        data_buffers: 3,
        ..p
    }
    .pool_params(2);
    assert_eq!((odd.capsule_buffers, odd.data_buffers), (151, 2));
    // A device budget below one queue is not inflated per reactor.
    let small = RdmaParams {
        capsule_buffers: 100,
        ..p
    }
    .pool_params(4);
    assert_eq!(small.capsule_buffers, 100);
    assert_eq!(p.pool_params(0), one, "0 reactors counts as one");
}

#[test]
fn listener_reports_missing_rdma_as_a_typed_error() {
    // This holds on machines without an RDMA device (CI, this workstation); with one,
    // binding an address that is on no RDMA interface must still fail cleanly.
    let r = RdmaListener::new("192.0.2.1".parse().unwrap(), 4420, params());
    match r {
        Err(RdmaError::NotSupported(_) | RdmaError::NoDevice | RdmaError::Listen { .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("bound an RDMA listener to a TEST-NET address"),
    }
}

#[test]
fn invalid_pool_parameters_are_refused_before_touching_verbs() {
    let mut p = params();
    p.data_buffers = 0;
    assert!(matches!(
        RdmaListener::new("127.0.0.1".parse().unwrap(), 4420, p),
        Err(RdmaError::Pool(_))
    ));
}
