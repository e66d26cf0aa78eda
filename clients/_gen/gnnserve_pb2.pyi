from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NewNode(_message.Message):
    __slots__ = ("features", "neighbors", "edge_weights")
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    EDGE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    features: _containers.RepeatedScalarFieldContainer[float]
    neighbors: _containers.RepeatedScalarFieldContainer[int]
    edge_weights: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, features: _Optional[_Iterable[float]] = ..., neighbors: _Optional[_Iterable[int]] = ..., edge_weights: _Optional[_Iterable[float]] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("model", "version", "nodes", "sampling_width", "ppr_budget", "max_accuracy_loss", "return_probabilities", "return_embeddings", "request_id", "new_nodes", "min_graph_version", "packed_outputs")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PPR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_ACCURACY_LOSS_FIELD_NUMBER: _ClassVar[int]
    RETURN_PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    RETURN_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_NODES_FIELD_NUMBER: _ClassVar[int]
    MIN_GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    PACKED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    nodes: _containers.RepeatedScalarFieldContainer[int]
    sampling_width: int
    ppr_budget: int
    max_accuracy_loss: float
    return_probabilities: bool
    return_embeddings: bool
    request_id: str
    new_nodes: _containers.RepeatedCompositeFieldContainer[NewNode]
    min_graph_version: int
    packed_outputs: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., nodes: _Optional[_Iterable[int]] = ..., sampling_width: _Optional[int] = ..., ppr_budget: _Optional[int] = ..., max_accuracy_loss: _Optional[float] = ..., return_probabilities: bool = ..., return_embeddings: bool = ..., request_id: _Optional[str] = ..., new_nodes: _Optional[_Iterable[_Union[NewNode, _Mapping]]] = ..., min_graph_version: _Optional[int] = ..., packed_outputs: bool = ...) -> None: ...

class Settings(_message.Message):
    __slots__ = ("sampling_width", "ppr_budget", "strategy", "extractor", "chosen_by", "expected_accuracy", "edges_kept", "edges_total")
    SAMPLING_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PPR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_BY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    EDGES_KEPT_FIELD_NUMBER: _ClassVar[int]
    EDGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    sampling_width: int
    ppr_budget: int
    strategy: str
    extractor: str
    chosen_by: str
    expected_accuracy: float
    edges_kept: int
    edges_total: int
    def __init__(self, sampling_width: _Optional[int] = ..., ppr_budget: _Optional[int] = ..., strategy: _Optional[str] = ..., extractor: _Optional[str] = ..., chosen_by: _Optional[str] = ..., expected_accuracy: _Optional[float] = ..., edges_kept: _Optional[int] = ..., edges_total: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_ms", "subgraph_ms", "features_ms", "forward_ms", "total_ms", "batch_size")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    SUBGRAPH_MS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_MS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    subgraph_ms: float
    features_ms: float
    forward_ms: float
    total_ms: float
    batch_size: int
    def __init__(self, queue_ms: _Optional[float] = ..., subgraph_ms: _Optional[float] = ..., features_ms: _Optional[float] = ..., forward_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., batch_size: _Optional[int] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("model", "version", "request_id", "labels", "num_classes", "probabilities", "embedding_dim", "embeddings", "settings", "timing", "data_version", "graph_version", "served_by", "packed", "packed_labels", "packed_probabilities", "packed_embeddings")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIM_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    PACKED_LABELS_FIELD_NUMBER: _ClassVar[int]
    PACKED_PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    PACKED_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    request_id: str
    labels: _containers.RepeatedScalarFieldContainer[int]
    num_classes: int
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    embedding_dim: int
    embeddings: _containers.RepeatedScalarFieldContainer[float]
    settings: Settings
    timing: Timing
    data_version: str
    graph_version: int
    served_by: str
    packed: bool
    packed_labels: bytes
    packed_probabilities: bytes
    packed_embeddings: bytes
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., request_id: _Optional[str] = ..., labels: _Optional[_Iterable[int]] = ..., num_classes: _Optional[int] = ..., probabilities: _Optional[_Iterable[float]] = ..., embedding_dim: _Optional[int] = ..., embeddings: _Optional[_Iterable[float]] = ..., settings: _Optional[_Union[Settings, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., data_version: _Optional[str] = ..., graph_version: _Optional[int] = ..., served_by: _Optional[str] = ..., packed: bool = ..., packed_labels: _Optional[bytes] = ..., packed_probabilities: _Optional[bytes] = ..., packed_embeddings: _Optional[bytes] = ...) -> None: ...

class KnobRow(_message.Message):
    __slots__ = ("ppr_budget", "sampling_width", "val_accuracy", "latency_ms_per_node", "edges_kept_fraction", "agreement")
    PPR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_WIDTH_FIELD_NUMBER: _ClassVar[int]
    VAL_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    EDGES_KEPT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    ppr_budget: int
    sampling_width: int
    val_accuracy: float
    latency_ms_per_node: float
    edges_kept_fraction: float
    agreement: float
    def __init__(self, ppr_budget: _Optional[int] = ..., sampling_width: _Optional[int] = ..., val_accuracy: _Optional[float] = ..., latency_ms_per_node: _Optional[float] = ..., edges_kept_fraction: _Optional[float] = ..., agreement: _Optional[float] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "version", "versions", "architecture", "extractor", "num_features", "num_classes", "num_nodes", "max_ppr_budget", "default_sampling_width", "default_ppr_budget", "strategy", "knob_table", "metrics", "dataset_fingerprint", "ready", "feature_store", "max_sampling_width", "max_nodes_per_request", "graph_version", "read_only", "served_by", "max_request_work", "max_new_node_edges")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_FIELD_NUMBER: _ClassVar[int]
    NUM_FEATURES_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_PPR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_SAMPLING_WIDTH_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PPR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    KNOB_TABLE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    DATASET_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    FEATURE_STORE_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLING_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_WORK_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_NODE_EDGES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    versions: _containers.RepeatedScalarFieldContainer[str]
    architecture: str
    extractor: str
    num_features: int
    num_classes: int
    num_nodes: int
    max_ppr_budget: int
    default_sampling_width: int
    default_ppr_budget: int
    strategy: str
    knob_table: _containers.RepeatedCompositeFieldContainer[KnobRow]
    metrics: _containers.ScalarMap[str, float]
    dataset_fingerprint: str
    ready: bool
    feature_store: str
    max_sampling_width: int
    max_nodes_per_request: int
    graph_version: int
    read_only: bool
    served_by: str
    max_request_work: int
    max_new_node_edges: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., versions: _Optional[_Iterable[str]] = ..., architecture: _Optional[str] = ..., extractor: _Optional[str] = ..., num_features: _Optional[int] = ..., num_classes: _Optional[int] = ..., num_nodes: _Optional[int] = ..., max_ppr_budget: _Optional[int] = ..., default_sampling_width: _Optional[int] = ..., default_ppr_budget: _Optional[int] = ..., strategy: _Optional[str] = ..., knob_table: _Optional[_Iterable[_Union[KnobRow, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., dataset_fingerprint: _Optional[str] = ..., ready: bool = ..., feature_store: _Optional[str] = ..., max_sampling_width: _Optional[int] = ..., max_nodes_per_request: _Optional[int] = ..., graph_version: _Optional[int] = ..., read_only: bool = ..., served_by: _Optional[str] = ..., max_request_work: _Optional[int] = ..., max_new_node_edges: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class FeatureRow(_message.Message):
    __slots__ = ("node", "features")
    NODE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    node: int
    features: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, node: _Optional[int] = ..., features: _Optional[_Iterable[float]] = ...) -> None: ...

class Edge(_message.Message):
    __slots__ = ("src", "dst", "weight")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    src: int
    dst: int
    weight: float
    def __init__(self, src: _Optional[int] = ..., dst: _Optional[int] = ..., weight: _Optional[float] = ...) -> None: ...

class UpdateGraphRequest(_message.Message):
    __slots__ = ("model", "version", "features", "new_nodes", "remove_edges", "add_edges", "request_id", "expect_graph_version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    NEW_NODES_FIELD_NUMBER: _ClassVar[int]
    REMOVE_EDGES_FIELD_NUMBER: _ClassVar[int]
    ADD_EDGES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECT_GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    features: _containers.RepeatedCompositeFieldContainer[FeatureRow]
    new_nodes: _containers.RepeatedCompositeFieldContainer[NewNode]
    remove_edges: _containers.RepeatedCompositeFieldContainer[Edge]
    add_edges: _containers.RepeatedCompositeFieldContainer[Edge]
    request_id: str
    expect_graph_version: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., features: _Optional[_Iterable[_Union[FeatureRow, _Mapping]]] = ..., new_nodes: _Optional[_Iterable[_Union[NewNode, _Mapping]]] = ..., remove_edges: _Optional[_Iterable[_Union[Edge, _Mapping]]] = ..., add_edges: _Optional[_Iterable[_Union[Edge, _Mapping]]] = ..., request_id: _Optional[str] = ..., expect_graph_version: _Optional[int] = ...) -> None: ...

class UpdateGraphResponse(_message.Message):
    __slots__ = ("graph_version", "new_node_ids", "num_nodes", "num_edges", "request_id", "invalidated", "apply_ms")
    class InvalidatedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GRAPH_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEW_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    NUM_EDGES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    APPLY_MS_FIELD_NUMBER: _ClassVar[int]
    graph_version: int
    new_node_ids: _containers.RepeatedScalarFieldContainer[int]
    num_nodes: int
    num_edges: int
    request_id: str
    invalidated: _containers.ScalarMap[str, int]
    apply_ms: float
    def __init__(self, graph_version: _Optional[int] = ..., new_node_ids: _Optional[_Iterable[int]] = ..., num_nodes: _Optional[int] = ..., num_edges: _Optional[int] = ..., request_id: _Optional[str] = ..., invalidated: _Optional[_Mapping[str, int]] = ..., apply_ms: _Optional[float] = ...) -> None: ...

class UpdateLogRecord(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.RepeatedCompositeFieldContainer[UpdateGraphRequest]
    def __init__(self, updates: _Optional[_Iterable[_Union[UpdateGraphRequest, _Mapping]]] = ...) -> None: ...
