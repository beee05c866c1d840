"""Message keys shared by the ServerApp and the ClientApps (kebab-case, one place)."""

# Record names inside a Message's RecordDict
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

# ConfigRecord keys (server -> client)
SERVER_ROUND = "server-round"
TASK = "task"  # fedflex.taskspec.TaskSpec as JSON: dataset / partition / model / num_clients / seed / device
SEED = "seed"
WANT_LOSS = "want-loss"  # query: evaluate the sent model on the local data
# typed options objects (fedflex.records: "<prefix>.<field-name>" entries)
CLIENT = "client"  # fedflex.config.ClientConfig's training fields: client.lr, client.epochs, ...
LOCAL_RULE = "local-rule"  # fedflex.config.LocalRuleConfig: local-rule.name, local-rule.fedprox.mu, ...

# Further array records in train messages / replies
SCAFFOLD_C = "scaffold-c"  # server control variate (server -> client)
SCAFFOLD_DC = "scaffold-dc"  # change of the client's control variate (client -> server)
SCAFFOLD_CI = "scaffold-ci"  # the client's control variate (node state)
HERD_G = "herd-g"  # BHerd / GraB: sum of the selected (uncentred) local gradients (client -> server)
FEDNOVA_D = "fednova-d"  # FedNova: normalised update (x - y_i) / ||a_i||_1 (client -> server)
FEDDYN_GRAD = "feddyn-grad"  # FedDyn: the client's gradient state g_k (node state)
FEDCM_DELTA = "fedcm-delta"  # FedCM: the global momentum Delta (server -> client)

# MetricRecord / ConfigRecord keys (client -> server)
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
EVAL_LOSS = "eval-loss"
EVAL_ACCURACY = "eval-accuracy"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
NUM_STEPS = "num-steps"
HERD_TAU = "herd-tau"  # BHerd / GraB: local steps tau_i
HERD_K = "herd-k"  # BHerd / GraB: selected steps k_i
HERD_ALPHA_I = "herd-alpha-i"  # k_i / tau_i (GraB's alpha_i)
HERD_DISTANCE = "herd-distance"  # ||g_i / k_i - mean_l z_l|| (the paper's Fig. 4d, k_i = alpha tau_i)
HERD_MEAN_NORM = "herd-mean-norm"  # ||mean_l z_l||: distance / mean norm = how far the herded step is from FedAvg's
FEDNOVA_TAU = "fednova-tau"  # FedNova: local steps tau_i
FEDNOVA_A_NORM = "fednova-a-norm"  # FedNova: ||a_i||_1 (tau_i for plain SGD)
LOCAL_EPOCHS = "local-epochs"  # client.epochs_range / batch_size_range on: the epochs this client drew
LOCAL_BATCH_SIZE = "local-batch-size"  # ... and its batch size (both sent when either option is on)
STEP_CAPS = "step-caps"  # system.partial: JSON {client id: local steps that fit the deadline}, capped clients only

# node_config keys (SuperNode side)
NODE_PARTITION_ID = "partition-id"
NODE_NUM_PARTITIONS = "num-partitions"
NODE_DATA_PATH = "data-path"

# Cohort messages (simulation only: fedflex.launch.cohort_grid <-> clients.cohort_app)
COHORT_CLIENTS = "cohort-clients"  # JSON list of the client ids a packed train message trains
COHORT_VECTORIZE = "cohort-vectorize"  # simulation.vectorize for the worker
COHORT_SIZE = "cohort-size"  # simulation.cohort_size for the worker
COHORT_ERROR = "cohort-error"  # a packed reply's config record for a client that failed
