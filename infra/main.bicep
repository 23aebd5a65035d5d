// Scheduler Agent Supervisor on Azure Functions: what `azd up` provisions.
//
// This file creates the resource group and deploys resources.bicep into it; the
// resources, and the reasons for each setting, are described there.
//
//   az deployment sub create --location <region> --template-file infra/main.bicep \
//     --parameters environmentName=<env> location=<region> alertEmail=<email> \
//                  remoteInventoryUrl=<url> remotePaymentsUrl=<url> remoteShippingUrl=<url>

targetScope = 'subscription'

// --- Parameters --------------------------------------------------------------------------

@minLength(1)
@maxLength(64)
@description('Name of the azd environment. Used for the resource group name and, hashed, in every resource name.')
param environmentName string

@minLength(1)
@description('Region for every resource. It must offer the Flex Consumption plan (az functionapp list-flexconsumption-locations).')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

// Base URL of each remote service the workflow calls (core/workflow.py): one required
// parameter per remote service, each becoming its app setting REMOTE_<NAME>_URL
// (resources.bicep, remoteServices). azd reads them from the environment variables of
// the same name (main.parameters.json).
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

@description('Name of the resource group to create. Default: rg-<environmentName>.')
param resourceGroupName string = ''

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

@description('SUPERVISOR_SCHEDULE: NCRONTAB with seconds (six fields) for the supervisor\'s timer.')
param supervisorSchedule string = '*/15 * * * * *'

@minValue(0)
@description('RETENTION_DAYS: finished orders that ended this many days ago or more are archived to blob storage, then deleted (docs/retention.md).')
param retentionDays int = 30

@description('RETENTION_INCLUDE_ERROR: archive and delete Error orders too.')
param retentionIncludeError bool = false

@minValue(1)
@maxValue(100000)
@description('RETENTION_MAX_ORDERS_PER_TICK: the most orders one retention tick archives and deletes.')
param retentionMaxOrdersPerTick int = 5000

@description('RETENTION_SCHEDULE: NCRONTAB with seconds (six fields) for the retention timer.')
param retentionSchedule string = '0 * * * * *'

@description('PYTHON_THREADPOOL_THREAD_COUNT: threads of the Python worker\'s pool for sync functions, per instance (set explicitly; see resources.bicep).')
@minValue(1)
param workerThreads int = 16

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
@description('Storage accounts the order state is spread over (STATE_STORAGE_ACCOUNTS), each order in the one a hash of its id picks; ~1,300 orders/s each at 80% of its request rate (docs/scale.md). 1: one account (the host\'s, or separateStateStorage\'s). Fixed for the deployment\'s life.')
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

// The status API (api/): who may call it.
@description('Application (client) id of the status API\'s Microsoft Entra ID app registration, with the app roles Orders.Read and Orders.Operate (docs/deploy.md creates it). Set: App Service Authentication admits only tokens for it, and the API checks the caller\'s role (API_AUTH=easyauth). Empty: no authentication is configured and the API refuses every call (API_AUTH=disabled).')
param apiClientId string = ''

// Past one deployment's ceiling (docs/scale.md, "Past one deployment: stamps"): the
// Deployment Stamps pattern (learn.microsoft.com/azure/architecture/patterns/deployment-stamp,
// read 2026-11-25). Each stamp is everything resources.bicep deploys, in a resource group of
// its own; clients send each order to the stamp its id picks (core/names.py stamp_of).
@minValue(1)
@maxValue(16)
@description('Stamps: whole, independent copies of the deployment (namespace, accounts, function app, alerts), each in a resource group of its own; every client sends an order to the stamp core/names.py stamp_of picks from its id (docs/clients.md, "Sending orders"). 1: one deployment, as without stamps. Fixed once orders flow: a changed count sends an order\'s resends to another stamp.')
param stamps int = 1

@description('Region of each stamp, in stamp order (stamp 0 first); a stamp without an entry is in location. Flex Consumption\'s memory quota is per subscription and region, so stamps in one region share it (docs/scale.md).')
param stampLocations array = []

// --- Resources -------------------------------------------------------------------------

// Stamp 0 keeps the names of a deployment without stamps (its group, its resourceToken).
var baseResourceGroupName = !empty(resourceGroupName) ? resourceGroupName : 'rg-${environmentName}'
var stampGroupNames = [for stamp in range(0, stamps): (stamp == 0 ? baseResourceGroupName : '${baseResourceGroupName}-stamp${stamp}')]
var stampRegions = [for stamp in range(0, stamps): (stamp < length(stampLocations) ? stampLocations[stamp] : location)]

resource rg 'Microsoft.Resources/resourceGroups@2022-09-01' = [for stamp in range(0, stamps): {
  name: stampGroupNames[stamp]
  location: stampRegions[stamp]
  tags: {
    'azd-env-name': environmentName
  }
}]

module resources 'resources.bicep' = [for stamp in range(0, stamps): {
  name: 'resources'
  scope: rg[stamp]
  params: {
    environmentName: environmentName
    location: stampRegions[stamp]
    stamp: stamp
    remoteInventoryUrl: remoteInventoryUrl
    remotePaymentsUrl: remotePaymentsUrl
    remoteShippingUrl: remoteShippingUrl
    alertEmail: alertEmail
    principalId: principalId
    principalType: principalType
    stepTimeoutSeconds: stepTimeoutSeconds
    pendingTimeoutSeconds: pendingTimeoutSeconds
    responseGraceSeconds: responseGraceSeconds
    maxFailures: maxFailures
    approvalTimeoutSeconds: approvalTimeoutSeconds
    supervisorSchedule: supervisorSchedule
    retentionDays: retentionDays
    retentionIncludeError: retentionIncludeError
    retentionMaxOrdersPerTick: retentionMaxOrdersPerTick
    retentionSchedule: retentionSchedule
    workerThreads: workerThreads
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    serviceBusScaleMonitoring: serviceBusScaleMonitoring
    serviceBusSku: serviceBusSku
    serviceBusCapacity: serviceBusCapacity
    serviceBusPartitions: serviceBusPartitions
    separateStateStorage: separateStateStorage
    stateStorageAccounts: stateStorageAccounts
    serviceBusMaxConcurrentCalls: serviceBusMaxConcurrentCalls
    activeIndexShards: activeIndexShards
    apiClientId: apiClientId
    traceSampleRatio: traceSampleRatio
  }
}]

// --- Outputs (azd writes them to .azure/<env>/.env) ----------------------------------------

// Stamp 0's, as without stamps (azd deploys the code to its app; docs/deploy.md deploys the others).
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = stampGroupNames[0]
output AZURE_FUNCTION_APP_NAME string = resources[0].outputs.AZURE_FUNCTION_APP_NAME
output SERVICE_APP_NAME string = resources[0].outputs.AZURE_FUNCTION_APP_NAME
output AZURE_STORAGE_ACCOUNT_NAME string = resources[0].outputs.AZURE_STORAGE_ACCOUNT_NAME
output AZURE_STATE_STORAGE_ACCOUNT_NAME string = resources[0].outputs.AZURE_STATE_STORAGE_ACCOUNT_NAME
output AZURE_STATE_STORAGE_ACCOUNT_NAMES string = resources[0].outputs.AZURE_STATE_STORAGE_ACCOUNT_NAMES
output AZURE_SERVICEBUS_NAMESPACE_NAME string = resources[0].outputs.AZURE_SERVICEBUS_NAMESPACE_NAME
output AZURE_SERVICEBUS_FULLY_QUALIFIED_NAMESPACE string = resources[0].outputs.AZURE_SERVICEBUS_FULLY_QUALIFIED_NAMESPACE
output AZURE_MANAGED_IDENTITY_CLIENT_ID string = resources[0].outputs.AZURE_MANAGED_IDENTITY_CLIENT_ID
output AZURE_APPLICATION_INSIGHTS_NAME string = resources[0].outputs.AZURE_APPLICATION_INSIGHTS_NAME
output AZURE_ORDERS_QUEUE_NAME string = resources[0].outputs.AZURE_ORDERS_QUEUE_NAME
output AZURE_API_URL string = resources[0].outputs.AZURE_API_URL
// Every stamp, in stamp order (the order clients pick from: core/names.py stamp_of): its
// group, region, app, accounts, namespace, orders queue and status API: what ordersctl's
// settings for that stamp need (docs/deploy.md, "Stamps").
output AZURE_STAMPS array = [for stamp in range(0, stamps): {
  stamp: stamp
  resourceGroup: stampGroupNames[stamp]
  location: stampRegions[stamp]
  functionAppName: resources[stamp].outputs.AZURE_FUNCTION_APP_NAME
  storageAccountName: resources[stamp].outputs.AZURE_STORAGE_ACCOUNT_NAME
  stateStorageAccountNames: resources[stamp].outputs.AZURE_STATE_STORAGE_ACCOUNT_NAMES
  serviceBusNamespace: resources[stamp].outputs.AZURE_SERVICEBUS_FULLY_QUALIFIED_NAMESPACE
  ordersQueue: resources[stamp].outputs.AZURE_ORDERS_QUEUE_NAME
  apiUrl: resources[stamp].outputs.AZURE_API_URL
}]
// ORDERS_STAMPS for ordersctl (the namespaces, comma-separated in stamp order) is read
// from AZURE_STAMPS (docs/deploy.md): a variable cannot hold module outputs (Resource
// Manager resolves variables before any deployment runs), and a lambda cannot index a
// module collection.
