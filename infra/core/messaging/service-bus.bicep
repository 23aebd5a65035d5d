// The Service Bus namespace (Standard by default: queues, duplicate detection,
// dead-lettering; or Premium with messaging units and partitions, docs/scale.md) and its
// queues. Local (SAS key) authentication is disabled: no connection string
// exists for anyone to leak; senders and receivers authenticate with Entra ID.

param name string
param location string = resourceGroup().location
param tags object = {}

@allowed([
  'Standard'
  'Premium'
])
@description('Standard: 1,000 credits/s per namespace, messages up to 256 KB. Premium: dedicated messaging units, messages up to 1 MB by default (docs/scale.md).')
param sku string = 'Standard'

@allowed([
  1
  2
  4
  8
  16
])
@description('Premium only: messaging units. A multiple of partitions (Azure refuses the namespace otherwise).')
param capacity int = 1

@allowed([
  1
  2
  4
])
@description('Premium only: partitions, each with capacity / partitions messaging units. Set at creation only: Azure cannot change it on an existing namespace.')
param partitions int = 1

@description('Queues to create: [{ name, properties }], properties as in Microsoft.ServiceBus/namespaces/queues.')
param queues array

@description('Principals that send and receive: [{ id, type }] with type User or ServicePrincipal.')
param dataPrincipals array

@description('Principal (the app identity) that also gets Data Owner so the platform can read queue lengths to scale the triggers. Empty: none.')
param scaleMonitorPrincipalId string = ''

// Built-in role definition ids (Azure built-in roles, Integration category).
var serviceBusDataSenderRoleId = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39' // Azure Service Bus Data Sender
var serviceBusDataReceiverRoleId = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0' // Azure Service Bus Data Receiver
var serviceBusDataOwnerRoleId = '090c5cfd-751d-490a-894a-3ce6f1109419' // Azure Service Bus Data Owner

var premium = sku == 'Premium'
var partitioned = premium && partitions > 1

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  // Premium's messaging units and partitions (premiumMessagingPartitions, 1, 2 or 4, set at
  // creation only): learn.microsoft.com/azure/service-bus-messaging/enable-partitions-premium
  sku: premium ? {
    name: 'Premium'
    tier: 'Premium'
    capacity: capacity
  } : {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: union({
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }, premium ? {
    premiumMessagingPartitions: partitions
  } : {})
}

// A partitioned Premium namespace takes partitioned queues only.
resource queue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [for spec in queues: {
  parent: namespace
  name: spec.name
  properties: union(spec.properties, partitioned ? {
    enablePartitioning: true
  } : {})
}]

// Send: requests to the agents, their responses, status events, alerts (the app uses the SDK).
resource dataSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principal in dataPrincipals: {
  name: guid(namespace.id, principal.id, serviceBusDataSenderRoleId)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSenderRoleId)
    principalId: principal.id
    principalType: principal.type
  }
}]

// Receive: the Service Bus triggers (orders, each remote service's <remote>-requests,
// agent-responses), and the operator reading alerts and dead letters.
resource dataReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principal in dataPrincipals: {
  name: guid(namespace.id, principal.id, serviceBusDataReceiverRoleId)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiverRoleId)
    principalId: principal.id
    principalType: principal.type
  }
}]

// Scale: Flex Consumption scales Service Bus triggers on queue length, which the
// platform reads as the app identity; reading queue runtime properties needs the
// Manage claim, which of the built-in data roles only Data Owner carries. Without it
// scaling falls back to less accurate signals. Optional (serviceBusScaleMonitoring).
resource dataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(scaleMonitorPrincipalId)) {
  name: guid(namespace.id, scaleMonitorPrincipalId, serviceBusDataOwnerRoleId)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataOwnerRoleId)
    principalId: scaleMonitorPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output name string = namespace.name
output resourceId string = namespace.id
// <name>.servicebus.windows.net: what ServiceBusConnection__fullyQualifiedNamespace needs.
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
