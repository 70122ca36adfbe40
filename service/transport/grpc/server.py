"""Build the gRPC server: ShadowEvaluation, standard health and reflection."""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.transport.grpc.servicer import (
    SERVICE_NAME,
    ShadowEvaluationServicer,
    generic_handler,
)
from service.transport.grpc.stream_limits import StreamAdmission, StreamAdmissionInterceptor
from service.wire.understudy.v1 import shadow_pb2

# gRPC's own limit sits above ours so that an oversized message reaches the
# servicer and is refused as INVALID_ARGUMENT, counted; only absurd sizes
# (> 4x the limit) are cut off by gRPC itself with RESOURCE_EXHAUSTED.
_GRPC_LIMIT_FACTOR = 4


def build_grpc_server(
    servicer: ShadowEvaluationServicer,
    host: str,
    port: int,
    max_workers: int,
    max_request_bytes: int,
    tls: tuple[bytes, bytes] | None = None,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """Create (not start) the server; returns it, the bound port and the health servicer.

    `tls` is (private key PEM, certificate chain PEM); None serves plaintext.

    A sync gRPC stream holds a pool thread for its whole life, so the pool has
    `max_workers` threads for unary calls *on top of* one per admissible stream
    (`servicer.stream_limits.total`): streams past their limits are refused by the
    admission interceptor, so held streams can never take the unary threads.
    """
    limit = max_request_bytes * _GRPC_LIMIT_FACTOR
    streams = servicer.stream_limits
    admission = StreamAdmission(streams, servicer.metrics)
    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=max_workers + streams.total, thread_name_prefix="grpc"
        ),
        interceptors=(StreamAdmissionInterceptor(admission, servicer.principal_of),),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 1024 * 1024),
        ],
        # Past this gRPC itself answers RESOURCE_EXHAUSTED before any handler runs
        # (uncounted by us): a queue of 4 calls per unary worker, plus the streams.
        maximum_concurrent_rpcs=max_workers * 4 + streams.total,
    )
    server.add_generic_rpc_handlers((generic_handler(servicer),))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (
            shadow_pb2.DESCRIPTOR.services_by_name["ShadowEvaluation"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    if tls is None:
        bound = server.add_insecure_port(f"{host}:{port}")
    else:
        key, chain = tls
        bound = server.add_secure_port(
            f"{host}:{port}", grpc.ssl_server_credentials([(key, chain)])
        )
    if bound == 0:
        raise OSError(f"could not bind gRPC on {host}:{port}")
    return server, bound, health_servicer
