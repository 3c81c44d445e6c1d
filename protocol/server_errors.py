"""The one table from Magnetar's error catalogue to Pulsar's ServerError codes (what
the official clients react to: ServiceNotReady makes them look the topic up again and
retry, TopicNotFound and the like fail the operation)."""

from __future__ import annotations

from protocol.proto import pulsar_api_pb2 as pb
from common import errors

_TABLE: list[tuple[type[errors.MagnetarError], int]] = [
    # The official clients raise AuthenticationError / AuthorizationError for these.
    (errors.AuthenticationFailed, pb.AuthenticationError),
    (errors.Unauthorized, pb.AuthenticationError),
    (errors.AuthorizationDenied, pb.AuthorizationError),
    (errors.ConnectionLimit, pb.TooManyRequests),
    # As Pulsar answers a producer that does not encrypt where encryption is required.
    (errors.EncryptionRequired, pb.MetadataError),
    (errors.TopicNotFound, pb.TopicNotFound),
    (errors.NamespaceNotFound, pb.TopicNotFound),
    (errors.TenantNotFound, pb.TopicNotFound),
    (errors.SubscriptionNotFound, pb.SubscriptionNotFound),
    (errors.ConsumerBusy, pb.ConsumerBusy),
    (errors.ProducerBusy, pb.ProducerBusy),
    (errors.ProducerFenced, pb.ProducerFenced),
    (errors.TopicTerminated, pb.TopicTerminatedError),
    (errors.TopicFenced, pb.ServiceNotReady),
    (errors.NotOwner, pb.ServiceNotReady),
    (errors.TransactionNotFound, pb.TransactionNotFound),
    (errors.InvalidTxnStatus, pb.InvalidTxnStatus),
    (errors.TransactionConflict, pb.TransactionConflict),
    (errors.TransactionCoordinatorNotFound, pb.TransactionCoordinatorNotFound),
    (errors.ServiceNotReady, pb.ServiceNotReady),
    (errors.ShuttingDown, pb.ServiceNotReady),
    (errors.NotAllowed, pb.NotAllowedError),
    (errors.PreconditionFailed, pb.NotAllowedError),
    (errors.PersistenceError, pb.PersistenceError),
    (errors.LedgerError, pb.PersistenceError),
    (errors.ChecksumError, pb.ChecksumError),
    (errors.TooManyRequests, pb.TooManyRequests),
    (errors.Overloaded, pb.TooManyRequests),
    (errors.ProducerBlockedQuotaException, pb.ProducerBlockedQuotaExceededException),
    (errors.ProducerBlockedQuota, pb.ProducerBlockedQuotaExceededError),
    (errors.IncompatibleSchema, pb.IncompatibleSchema),
    # An entry the ledger refuses as too large: the Java client fails just that message
    # on NotAllowedError, where an unknown error would make it reconnect and resend it.
    (errors.EntryTooLarge, pb.NotAllowedError),
    (errors.InvalidArgument, pb.InvalidTopicName),
    (errors.MetadataError, pb.MetadataError),
    (errors.OperationTimeout, pb.ServiceNotReady),
]


def server_error_for(error: BaseException) -> int:
    for cls, code in _TABLE:
        if isinstance(error, cls):
            return code
    return pb.UnknownError


# The other direction, for clients: a ServerError code a broker answered with, as the
# catalogue class the caller catches. Several catalogue classes share one Pulsar code
# above; this picks the one a client should see.
_BY_SERVER_ERROR: dict[int, type[errors.MagnetarError]] = {
    pb.TopicNotFound: errors.TopicNotFound,
    pb.SubscriptionNotFound: errors.SubscriptionNotFound,
    pb.ConsumerNotFound: errors.NotFound,
    pb.ConsumerBusy: errors.ConsumerBusy,
    pb.ProducerBusy: errors.ProducerBusy,
    pb.ProducerFenced: errors.ProducerFenced,
    pb.TopicTerminatedError: errors.TopicTerminated,
    pb.ServiceNotReady: errors.ServiceNotReady,
    pb.NotAllowedError: errors.NotAllowed,
    pb.PersistenceError: errors.PersistenceError,
    pb.ChecksumError: errors.ChecksumError,
    pb.TooManyRequests: errors.TooManyRequests,
    pb.ProducerBlockedQuotaExceededError: errors.ProducerBlockedQuota,
    pb.ProducerBlockedQuotaExceededException: errors.ProducerBlockedQuotaException,
    pb.IncompatibleSchema: errors.IncompatibleSchema,
    pb.InvalidTopicName: errors.InvalidArgument,
    pb.MetadataError: errors.MetadataError,
    pb.AuthenticationError: errors.AuthenticationFailed,
    pb.AuthorizationError: errors.AuthorizationDenied,
    pb.TransactionNotFound: errors.TransactionNotFound,
    pb.InvalidTxnStatus: errors.InvalidTxnStatus,
    pb.TransactionConflict: errors.TransactionConflict,
    pb.TransactionCoordinatorNotFound: errors.TransactionCoordinatorNotFound,
}


def error_for_server_error(server_error: int, message: str) -> errors.MagnetarError:
    """The typed error for a broker's ServerError answer (BrokerError when unknown)."""
    cls = _BY_SERVER_ERROR.get(server_error, errors.BrokerError)
    name = pb.ServerError.Name(server_error) if server_error in pb.ServerError.values() else str(server_error)
    error = cls.__new__(cls)
    errors.MagnetarError.__init__(error, message or name)
    return error
