// Every resource of the deployment, into one resource group. main.bicep creates the
// group and calls this file (what `azd up` runs); to deploy into a resource group that
// already exists, deploy this file directly:
//
//   az deployment group create --resource-group <rg> --template-file infra/resources.bicep \
//     --parameters environmentName=<env> alertEmail=<email> \
//                  remoteInventoryUrl=<url> remotePaymentsUrl=<url> remoteShippingUrl=<url>
//
//   ├─ user-assigned managed identity  (the app's only credential: no keys anywhere)
//   ├─ storage account                 (host storage, deployment package, state tables, scheduler queues)
//   ├─ (separateStateStorage) a second storage account for the state tables alone, or
//   │  (stateStorageAccounts > 1) that many, each order's rows in the one its id picks
//   ├─ Service Bus namespace, Standard or Premium (orders, one <remote>-requests queue per
//   │                                   remote service, agent-responses, alerts)
//   ├─ Log Analytics + Application Insights (Entra ID ingestion only; the app reads
//   │                                        its own spans for the operator page)
//   ├─ Flex Consumption plan + function app (Linux, Python 3.13)
//   ├─ action group (email) + metric alerts (dead letters, operator alerts)
//   │  + log search alerts on the app's metrics (deadline-miss rate, compensation rate)
//   └─ a workbook of the orders over time (states, deadline misses, compensations per step)
//
// Queue, table and app-setting names below are the ones in core/names.py; tests/infra
// checks that the two agree, and that every binding in function_app.py is provisioned.

// --- Parameters --------------------------------------------------------------------------

@minLength(1)
@maxLength(64)
@description('Name of the azd environment. Hashed into every resource name, and set as the azd-env-name tag.')
param environmentName string

@minLength(1)
@description('Region for every resource. It must offer the Flex Consumption plan (az functionapp list-flexconsumption-locations).')
param location string = resourceGroup().location

// Base URL of each remote service the workflow calls (core/workflow.py): one required
// parameter per remote service, each becoming its app setting REMOTE_<NAME>_URL (see
// remoteServices below).
@minLength(1)
@description('Base URL of the inventory service (app setting REMOTE_INVENTORY_URL). The agent POSTs <url>/<action>.')
param remoteInventoryUrl string

@minLength(1)
@description('Base URL of the payments service (app setting REMOTE_PAYMENTS_URL). The agent POSTs <url>/<action>.')
param remotePaymentsUrl string

@minLength(1)
@description('Base URL of the shipping service (app setting REMOTE_SHIPPING_URL). The agent POSTs <url>/<action>.')
param remoteShippingUrl string

@minLength(3)
@description('Email address of the operator who receives alerts: dead-lettered messages and orders that ended in Error.')
param alertEmail string

@description('Object id of the deploying developer. When set, they get the same data roles as the app, so the operator CLI works against this deployment. Leave empty in CI.')
param principalId string = ''

@allowed([
  'User'
  'ServicePrincipal'
])
@description('Kind of principal principalId is.')
param principalType string = 'User'

// Scheduler and supervisor policy (see adapters/settings.py for what each one means).
@minValue(1)
@description('STEP_TIMEOUT_SECONDS: how long one attempt of a step may take before the supervisor counts it as failed (default for steps whose policy in core/workflow.py sets none).')
param stepTimeoutSeconds int = 30

@minValue(1)
@description('PENDING_TIMEOUT_SECONDS: how long a Pending order may wait for the scheduler before the supervisor nudges it again.')
param pendingTimeoutSeconds int = 30

@minValue(0)
@maxValue(3600)
@description('RESPONSE_GRACE_SECONDS: how long past an attempt\'s deadline its answer is awaited at most while the responses queue still holds one sent in time; above the queues\' 60-s lock duration, which a delivery stranded on a dropped link waits out (docs/scale.md).')
param responseGraceSeconds int = 90

@minValue(1)
@maxValue(100)
@description('MAX_FAILURES: expired attempts after which a step gives up: it and the steps before it are undone, or, if it cannot be undone, the order goes to Error and the operator is alerted (default for steps whose policy sets none).')
param maxFailures int = 3

@minValue(1)
@maxValue(31536000)
@description('APPROVAL_TIMEOUT_SECONDS: how long a waiting step (an approval) waits for its event before the supervisor gives it up and the steps before it are undone (default for waiting steps whose policy in core/workflow.py sets no deadline); a year at most.')
param approvalTimeoutSeconds int = 86400

@description('PYTHON_THREADPOOL_THREAD_COUNT: threads of the Python worker\'s pool for sync functions, per instance.')
@minValue(1)
param workerThreads int = 16

@description('SUPERVISOR_SCHEDULE: NCRONTAB with seconds (six fields) for the supervisor\'s timer.')
param supervisorSchedule string = '*/15 * * * * *'

@description('OTEL_TRACES_SAMPLER_ARG: the share of orders whose trace is kept in Application Insights, 0 to 1 (1: every order). Decided once per trace, from its id, so an order is kept whole or not at all; metrics are never sampled, and every order stays in the state store, failed ones with a record the Functions host always keeps (docs/observability.md). The default, one order in 100, keeps telemetry under $1 per million orders (docs/scale.md).')
param traceSampleRatio string = '0.01'

// Flex Consumption scale settings.
@minValue(40)
@maxValue(1000)
@description('Upper bound on instances the app may scale out to.')
param maximumInstanceCount int = 40

@allowed([
  2048
  4096
])
@description('Memory of each instance, in MB.')
param instanceMemoryMB int = 2048

// How far one deployment goes (docs/scale.md, "The deployment's shape"): each of these
// trades cost for a ceiling.
@allowed([
  'Standard'
  'Premium'
])
@description('Service Bus tier. Standard: 1,000 credits/s per namespace shared by every send, receive and complete (about 50-70 orders/s). Premium: dedicated messaging units (serviceBusCapacity), billed by the hour whether used or not.')
param serviceBusSku string = 'Standard'

@allowed([
  1
  2
  4
  8
  16
])
@description('Premium only: messaging units of the namespace, a multiple of serviceBusPartitions.')
param serviceBusCapacity int = 1

@allowed([
  1
  2
  4
])
@description('Premium only: partitions of the namespace (each gets serviceBusCapacity / serviceBusPartitions units). Fixed when the namespace is created.')
param serviceBusPartitions int = 1

@description('A second storage account for the order state (the orders and rejections tables), apart from the host\'s AzureWebJobsStorage account: each account has its own request-rate target. The scheduler\'s storage queue stays with the host\'s account.')
param separateStateStorage bool = false

@minValue(1)
@maxValue(64)
@description('STATE_STORAGE_ACCOUNTS: storage accounts the order state is spread over, each order in the one a hash of its id picks (adapters/accounts.py); ~1,300 orders/s each at 80% of its request rate (~12 table requests per order). 1: one account (the host\'s, or the separate one of separateStateStorage). Above 1: that many accounts of their own (separateStateStorage implied). Fixed for the deployment\'s life: orders live where they were created.')
param stateStorageAccounts int = 1

@minValue(1)
@maxValue(1000)
@description('Service Bus messages each instance handles at once, per Service Bus trigger (host.json extensions.serviceBus.maxConcurrentCalls, overridden by an app setting).')
param serviceBusMaxConcurrentCalls int = 16

@minValue(1)
@maxValue(256)
@description('ACTIVE_INDEX_SHARDS: partitions of the active index (one row per in-flight order). May be changed with orders in flight.')
param activeIndexShards int = 16

@description('Grant the app identity Azure Service Bus Data Owner so the platform can read queue lengths to scale the Service Bus triggers (reading runtime properties needs the Manage claim). Set false to keep the app at Data Sender + Data Receiver only.')
param serviceBusScaleMonitoring bool = true

// Stamps (main.bicep): which copy of the deployment this is. 0: the first, or the only one.
@minValue(0)
@maxValue(15)
@description('This deployment\'s place among the stamps (main.bicep stamps; core/names.py stamp_of picks each order\'s). 0: the only deployment, or the first stamp: its names are those of a deployment without stamps.')
param stamp int = 0

// Retention (adapters/retention.py, docs/retention.md).
@minValue(0)
@description('RETENTION_DAYS: finished orders that ended this many days ago or more are archived to the archive container as JSON lines, then deleted from the table.')
param retentionDays int = 30

@description('RETENTION_INCLUDE_ERROR: archive and delete Error orders too (default: they stay for an operator).')
param retentionIncludeError bool = false

@minValue(1)
@maxValue(100000)
@description('RETENTION_MAX_ORDERS_PER_TICK: the most orders one retention tick archives and deletes.')
param retentionMaxOrdersPerTick int = 5000

@description('RETENTION_SCHEDULE: NCRONTAB with seconds (six fields) for the retention timer.')
param retentionSchedule string = '0 * * * * *'

// The status API (api/): who may call it.
@description('Application (client) id of the status API\'s Microsoft Entra ID app registration, with the app roles Orders.Read and Orders.Operate (docs/deploy.md creates it). Set: App Service Authentication admits only tokens for it, and the API checks the caller\'s role (API_AUTH=easyauth). Empty: no authentication is configured and the API refuses every call (API_AUTH=disabled).')
param apiClientId string = ''

// --- Names ---------------------------------------------------------------------------------

// Stamp 0 (or a deployment without stamps) keeps the token it always had; stamp N > 0 hashes
// its number in too, so its names differ even when it shares stamp 0's region.
var resourceToken = stamp == 0 ? toLower(uniqueString(subscription().id, environmentName, location)) : toLower(uniqueString(subscription().id, environmentName, location, 'stamp-${stamp}'))
var tags = {
  'azd-env-name': environmentName
}
var functionAppName = 'func-${resourceToken}'
// One blob container per app for its deployment package (functionAppConfig.deployment).
var deploymentContainerName = 'app-package-${take(functionAppName, 32)}-${take(resourceToken, 7)}'

// The app's queue and table names: the defaults in core/names.py.
var ordersQueueName = 'orders'
var orderEventsQueueName = 'order-events'
var cancellationsQueueName = 'order-cancellations'
var agentResponsesQueueName = 'agent-responses'
var alertsQueueName = 'alerts'
// The retention archive's container (core/names.py ARCHIVE_CONTAINER), in the host's account.
var archiveContainerName = 'archive'
var schedulerQueueName = 'scheduler'
// The scheduler's queues, one per shard (core/names.py SCHEDULER_QUEUE_SHARDS: an order's
// nudges all go to the queue its id picks, each queue read by a function of its own), and
// the single queue of before the sharding, still read so an upgrade loses no nudge.
// (range, map, toObject and join: Bicep's array and lambda functions,
// learn.microsoft.com/azure/azure-resource-manager/bicep/bicep-functions-array, read 2026-11-24.)
var schedulerQueueShards = 8
var schedulerShardQueueNames = map(range(0, schedulerQueueShards), shard => '${schedulerQueueName}-${shard}')
var schedulerQueueSettings = toObject(range(0, schedulerQueueShards), shard => 'SCHEDULER_QUEUE_${shard}', shard => '${schedulerQueueName}-${shard}')
var ordersTableName = 'orders'
var rejectionsTableName = 'rejections'

// --- Remote services -------------------------------------------------------------------------
// The remote services of core/workflow.py, each with its base URL. As core/names.py
// derives them, each one gets:
//   * a Service Bus queue '<name>-requests' for its agent function run_<name>_agent,
//   * the app setting <NAME>_REQUESTS_QUEUE naming that queue,
//   * the app setting REMOTE_<NAME>_URL with its base URL.
// Names are lower-case letters and digits (core/workflow.py checks), so they are valid
// queue names and upper-case into valid setting names. A new remote service is one
// entry here plus its URL parameter (here, in main.bicep and in main.parameters.json);
// tests/infra fails until every remote of core/workflow.py has all of it.
var remoteServices = [
  {
    name: 'inventory'
    url: remoteInventoryUrl
  }
  {
    name: 'payments'
    url: remotePaymentsUrl
  }
  {
    name: 'shipping'
    url: remoteShippingUrl
  }
]

// --- Service Bus queues ----------------------------------------------------------------------
// Every property is written out, so the values are visible here and comparable with
// core/names.py (SERVICEBUS_QUEUES). Azure's defaults are lockDuration PT1M,
// maxDeliveryCount 10, no expiry, no dead-lettering on expiry, no duplicate detection;
// the comments explain each departure. One departure is shared: messages expire after
// 14 days (alerts: 7), so a queue nobody drains does not grow forever. No sessions, no
// partitioning: ordering is not needed, and the state table serializes each order.

// Scheduler -> agent: one request queue per remote service (remoteServices above), so a
// slow service cannot starve the others. Each request carries its own time-to-live
// (complete-by minus now), always shorter than the queue default.
var requestsQueues = [for remote in remoteServices: {
  name: '${remote.name}-requests'
  properties: {
    // The agent stops at complete-by (the step's timeout: STEP_TIMEOUT_SECONDS, 30 s
    // by default), so a one-minute lock, renewed by the host, outlives any attempt.
    lockDuration: 'PT1M'
    // Fewer redeliveries than the default: each one repeats remote calls, and the
    // supervisor re-runs the step anyway once complete-by passes.
    maxDeliveryCount: 5
    defaultMessageTimeToLive: 'P14D'
    // An expired request is DISCARDED, not dead-lettered: the pattern forbids acting
    // after complete-by, and the supervisor recovers the step. A dead-lettered copy
    // would only invite someone to replay it late.
    deadLetteringOnMessageExpiration: false
    requiresDuplicateDetection: false
  }
}]

var serviceBusQueues = concat([
  {
    // Orders from any client.
    name: ordersQueueName
    properties: {
      // The submit_order function holds the lock only to write two table rows; a
      // minute (plus the host's lock renewal) is ample.
      lockDuration: 'PT1M'
      // A transient failure (storage throttled) is retried by redelivery; after 10
      // tries the order is kept whole in the dead-letter queue, where the dead-letter
      // alert (app/alerts.bicep) points the operator. Invalid orders never get here: the app rejects them
      // into the rejections table on the first delivery.
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      // An order nobody read in time is an operator's problem, not a silent loss.
      deadLetteringOnMessageExpiration: true
      // A client that resends after a timeout must not create a second order:
      // Service Bus drops a repeat MessageId inside the window. The app's own
      // idempotency (the order row keyed by order id) covers anything older.
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'P1D'
    }
  }
  {
    // Events for waiting steps (an approval) from any client, kept like orders: a
    // transient failure is retried by redelivery, an invalid or refused event is kept in
    // the rejections table on its first delivery, an event nobody read in time is
    // dead-lettered, and a resend with the same MessageId (the order id, the event name
    // and a hash of the body: docs/clients.md, "Sending order events") is dropped.
    name: orderEventsQueueName
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: true
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'P1D'
    }
  }
  {
    // Cancel requests from any client (docs/clients.md, "Cancelling an order"), kept like orders:
    // an invalid one is rejected into the rejections table at its first delivery; one
    // that keeps failing (storage down) dead-letters after 10 tries, as does one nobody
    // read in time. MessageId 'cancel:<order id>': a client's resend within the day is
    // dropped here, and the app's cancel is idempotent after that.
    name: cancellationsQueueName
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: true
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'P1D'
    }
  }
], requestsQueues, [
  {
    // Agents -> scheduler (all remote services share it). Duplicates and stale
    // attempts are fenced by the app (the Attempt number), so no broker-side
    // duplicate detection is needed.
    name: agentResponsesQueueName
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: false
      requiresDuplicateDetection: false
    }
  }
  {
    // Operator alerts (orders in Error). A metric alert e-mails the operator while
    // this queue is not empty; what nobody read within a week is dropped (the order's
    // Error state stays in the table).
    name: alertsQueueName
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P7D'
      deadLetteringOnMessageExpiration: false
      // Alerts are sent at least once (a crash between the Error write and the send
      // repeats the send); their MessageId is stable per failed attempt, so the
      // operator gets one alert per failure.
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'P1D'
    }
  }
])

// --- Resources -------------------------------------------------------------------------

module identity 'core/security/user-assigned-identity.bicep' = {
  name: 'identity'
  params: {
    name: 'id-${resourceToken}'
    location: location
    tags: tags
  }
}

// The app's identity, plus the developer's when principalId is given: both get the
// data roles (granted next to each resource, in its module).
var appPrincipals = [
  {
    id: identity.outputs.principalId
    type: 'ServicePrincipal'
  }
]
var developerPrincipals = empty(principalId) ? [] : [
  {
    id: principalId
    type: principalType
  }
]
var dataPrincipals = concat(appPrincipals, developerPrincipals)

module monitoring 'core/monitor/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    logAnalyticsName: 'log-${resourceToken}'
    applicationInsightsName: 'appi-${resourceToken}'
    location: location
    tags: tags
    metricsPublisherPrincipalId: identity.outputs.principalId
    logsReaderPrincipalId: identity.outputs.principalId
  }
}

var stateTableNames = [
  ordersTableName
  rejectionsTableName
]

module storage 'core/storage/storage-account.bicep' = {
  name: 'storage'
  params: {
    name: 'st${resourceToken}'
    location: location
    tags: tags
    deploymentContainerName: deploymentContainerName
    archiveContainerName: archiveContainerName
    // The Functions host moves a nudge that failed maxDequeueCount times (host.json)
    // to <queue>-poison. Provisioned up front so it exists, empty, where the operator
    // looks. (A poisoned nudge loses no order: the supervisor re-nudges the row.)
    queueNames: concat(
      concat(schedulerShardQueueNames, [schedulerQueueName]),
      map(concat(schedulerShardQueueNames, [schedulerQueueName]), queue => '${queue}-poison')
    )
    tableNames: stateAccountCount > 0 ? [] : stateTableNames
    dataPrincipals: dataPrincipals
  }
}

// The order state in accounts of its own: ~12 table requests per order no longer share the
// host account's request-rate target with the host and the scheduler's queues (~2 queue
// operations per order), which stay with the host (their triggers' connection is the
// host's; docs/scale.md says why the capacity model keeps them there). One account
// (separateStateStorage), or stateStorageAccounts of them, each order in the one its id
// picks. Tables only: the app and the developer get Storage Table Data Contributor there.
var stateAccountCount = stateStorageAccounts > 1 ? stateStorageAccounts : (separateStateStorage ? 1 : 0)
var stateAccountNames = map(range(0, stateAccountCount), i => i == 0 ? 'sts${resourceToken}' : 'sts${resourceToken}${i}')
module stateStorage 'core/storage/storage-account.bicep' = [for accountName in stateAccountNames: {
  name: 'stateStorage-${accountName}'
  params: {
    name: accountName
    location: location
    tags: tags
    queueNames: []
    tableNames: stateTableNames
    dataPrincipals: dataPrincipals
  }
}]

// The app's tables, identity-based like the others: one state account through StateStorage
// (adapters/clients.py), several through STATE_STORAGE_ACCOUNTS (their names, in order:
// never reorder them) with the identity StateStorage__clientId names.
var stateStorageSettings = stateAccountCount == 1 ? {
  StateStorage__accountName: stateAccountNames[0]
  StateStorage__credential: 'managedidentity'
  StateStorage__clientId: identity.outputs.clientId
} : (stateAccountCount > 1 ? {
  STATE_STORAGE_ACCOUNTS: join(stateAccountNames, ',')
  StateStorage__credential: 'managedidentity'
  StateStorage__clientId: identity.outputs.clientId
} : {})

module serviceBus 'core/messaging/service-bus.bicep' = {
  name: 'serviceBus'
  params: {
    name: 'sb-${resourceToken}'
    location: location
    tags: tags
    queues: serviceBusQueues
    sku: serviceBusSku
    capacity: serviceBusCapacity
    partitions: serviceBusPartitions
    dataPrincipals: dataPrincipals
    scaleMonitorPrincipalId: serviceBusScaleMonitoring ? identity.outputs.principalId : ''
  }
}

// Per remote service: <NAME>_REQUESTS_QUEUE names its request queue (read by its agent's
// trigger as %<NAME>_REQUESTS_QUEUE% and by the scheduler, which sends there; the
// queue name as in requestsQueues above), and REMOTE_<NAME>_URL is its base URL.
var requestsQueueSettings = toObject(remoteServices, remote => '${toUpper(remote.name)}_REQUESTS_QUEUE', remote => '${remote.name}-requests')
var remoteUrlSettings = toObject(remoteServices, remote => 'REMOTE_${toUpper(remote.name)}_URL', remote => remote.url)

module functionApp 'app/function-app.bicep' = {
  name: 'functionApp'
  params: {
    name: functionAppName
    planName: 'plan-${resourceToken}'
    location: location
    tags: tags
    serviceName: 'app'
    identityId: identity.outputs.resourceId
    identityClientId: identity.outputs.clientId
    storageAccountName: storage.outputs.name
    deploymentContainerName: deploymentContainerName
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    // What the app itself reads (adapters/settings.py). Every value is a name, a number
    // or a URL: connections are identity-based, there is no secret to set.
    appSettings: union({
      // Service Bus connection named by the triggers' `connection=` (ServiceBusConnection).
      ServiceBusConnection__fullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
      ServiceBusConnection__credential: 'managedidentity'
      ServiceBusConnection__clientId: identity.outputs.clientId
      // Queue and table names, read by bindings as %SETTING% and by the app.
      ORDERS_QUEUE: ordersQueueName
      ORDER_EVENTS_QUEUE: orderEventsQueueName
      CANCELLATIONS_QUEUE: cancellationsQueueName
      AGENT_RESPONSES_QUEUE: agentResponsesQueueName
      ALERTS_QUEUE: alertsQueueName
      SCHEDULER_QUEUE: schedulerQueueName
      ORDERS_TABLE: ordersTableName
      REJECTIONS_TABLE: rejectionsTableName
      // The scheduler/supervisor policy.
      STEP_TIMEOUT_SECONDS: string(stepTimeoutSeconds)
      PENDING_TIMEOUT_SECONDS: string(pendingTimeoutSeconds)
      RESPONSE_GRACE_SECONDS: string(responseGraceSeconds)
      MAX_FAILURES: string(maxFailures)
      APPROVAL_TIMEOUT_SECONDS: string(approvalTimeoutSeconds)
      SUPERVISOR_SCHEDULE: supervisorSchedule
      // Retention: the archive (a container of the host's account, identity-based through
      // ArchiveStorage so the host's own AzureWebJobsStorage settings stay as they are), how
      // old a finished order gets, and the timer (adapters/retention.py).
      ArchiveStorage__blobServiceUri: storage.outputs.blobEndpoint
      ArchiveStorage__credential: 'managedidentity'
      ArchiveStorage__clientId: identity.outputs.clientId
      ARCHIVE_CONTAINER: archiveContainerName
      RETENTION_DAYS: string(retentionDays)
      RETENTION_INCLUDE_ERROR: retentionIncludeError ? 'true' : 'false'
      RETENTION_MAX_ORDERS_PER_TICK: string(retentionMaxOrdersPerTick)
      RETENTION_SCHEDULE: retentionSchedule
      // Partitions of the active index (adapters/store.py); any change is safe with
      // orders in flight (docs/scale.md, "The active index, sharded").
      ACTIVE_INDEX_SHARDS: string(activeIndexShards)
      // Per instance and per Service Bus trigger: host.json's maxConcurrentCalls, overridden
      // here (learn.microsoft.com/azure/azure-functions/functions-host-json#override-hostjson-values).
      AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls: string(serviceBusMaxConcurrentCalls)
      // The Python worker's one thread pool for sync functions (submit_order,
      // schedule_order, complete_step, supervise: short table and Service Bus calls).
      // Set explicitly: left unset, what an instance gets depends on how its worker was
      // started (the host sets 1000, a worker started ahead of time its own default,
      // min(32, cores + 4)). The agents are async and take no thread while they wait on
      // a remote service. host.json's per-trigger limits (16 Service Bus calls, 16 + 8
      // queue messages) bound the work on top; the local host honours the same setting.
      PYTHON_THREADPOOL_THREAD_COUNT: string(workerThreads)
      // Who may call the status API (core/access.py): the caller's app role from App
      // Service Authentication (app/api-auth.bicep), or, without an app registration,
      // nobody: the app never trusts a principal header that Easy Auth did not set.
      API_AUTH: empty(apiClientId) ? 'disabled' : 'easyauth'
      // Traces and metrics go to Application Insights (adapters/telemetry.py, with the
      // APPLICATIONINSIGHTS_* settings of app/function-app.bicep); which traces are kept:
      // Application Insights' sampler, deciding from the trace id, so every hop of an
      // order decides alike.
      OTEL_TRACES_SAMPLER: 'microsoft.fixed_percentage'
      OTEL_TRACES_SAMPLER_ARG: traceSampleRatio
      // The operator page reads one order's spans from the component's workspace
      // (adapters/traces.py), as the app identity (Log Analytics Reader, granted in
      // core/monitor/monitoring.bicep).
      APPLICATIONINSIGHTS_WORKSPACE_ID: monitoring.outputs.logAnalyticsWorkspaceId
    }, requestsQueueSettings, schedulerQueueSettings, remoteUrlSettings, stateStorageSettings)
  }
}

// App Service Authentication in front of the status API, when its app registration is given.
module apiAuth 'app/api-auth.bicep' = if (!empty(apiClientId)) {
  name: 'apiAuth'
  params: {
    functionAppName: functionApp.outputs.name
    apiClientId: apiClientId
  }
}

module alerts 'app/alerts.bicep' = {
  name: 'alerts'
  params: {
    actionGroupName: 'ag-${resourceToken}'
    alertEmail: alertEmail
    serviceBusNamespaceName: serviceBus.outputs.name
    alertsQueueName: alertsQueueName
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    location: location
    tags: tags
  }
}

// The orders over time, from the app's metrics: a workbook on the component.
module workbook 'app/workbook.bicep' = {
  name: 'workbook'
  params: {
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    location: location
    tags: tags
  }
}

// --- Outputs -------------------------------------------------------------------------------

output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.name
output AZURE_STORAGE_ACCOUNT_NAME string = storage.outputs.name
// Where the order state is: the (first) state account when there is one, else the host's.
output AZURE_STATE_STORAGE_ACCOUNT_NAME string = stateAccountCount > 0 ? stateAccountNames[0] : storage.outputs.name
// Every account of the order state, comma-separated, in STATE_STORAGE_ACCOUNTS' order.
output AZURE_STATE_STORAGE_ACCOUNT_NAMES string = stateAccountCount > 0 ? join(stateAccountNames, ',') : storage.outputs.name
output AZURE_SERVICEBUS_NAMESPACE_NAME string = serviceBus.outputs.name
output AZURE_SERVICEBUS_FULLY_QUALIFIED_NAMESPACE string = serviceBus.outputs.fullyQualifiedNamespace
output AZURE_MANAGED_IDENTITY_CLIENT_ID string = identity.outputs.clientId
output AZURE_APPLICATION_INSIGHTS_NAME string = monitoring.outputs.applicationInsightsName
// What a client needs to send orders to this deployment, and the status API's base URL
// (host.json keeps the default route prefix 'api').
output AZURE_ORDERS_QUEUE_NAME string = ordersQueueName
output AZURE_API_URL string = 'https://${functionApp.outputs.defaultHostName}/api'
