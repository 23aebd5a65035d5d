// A storage account: the Functions host's own storage (AzureWebJobsStorage: blob
// leases, timer schedule state, queue trigger bookkeeping), the app's deployment
// package and the scheduler's queue, with the state tables unless they have an account
// of their own (separateStateStorage: this module again, with tables only). Shared keys are disabled, so
// nothing can reach it with an account key or a SAS signed by one; every client
// (the host, the app, the deploying developer) uses Entra ID and the roles below.

param name string
param location string = resourceGroup().location
param tags object = {}

@description('Blob container that holds the function app\'s deployment package. Empty: an account for tables only (no blob role granted).')
param deploymentContainerName string = ''

@description('Blob container of the retention archive (docs/retention.md). Empty: none.')
param archiveContainerName string = ''

@description('Storage queues to create.')
param queueNames array

@description('Tables to create.')
param tableNames array

@description('Principals that get the data roles: [{ id, type }] with type User or ServicePrincipal.')
param dataPrincipals array

// Built-in role definition ids (Azure built-in roles, Storage category).
var storageBlobDataOwnerRoleId = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b' // Storage Blob Data Owner
var storageBlobDataContributorRoleId = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe' // Storage Blob Data Contributor
var storageQueueDataContributorRoleId = '974c5e8b-45b9-4653-ba55-5f855dd0fb88' // Storage Queue Data Contributor
var storageTableDataContributorRoleId = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3' // Storage Table Data Contributor

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    dnsEndpointType: 'Standard'
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = if (!empty(deploymentContainerName)) {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

// The retention archive: finished orders as JSON lines, one blob per day (adapters/archive.py).
resource archiveContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = if (!empty(archiveContainerName)) {
  parent: blobService
  name: archiveContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

// Top-level (not nested) because Bicep cannot loop a nested child resource.
resource queue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for queueName in queueNames: {
  parent: queueService
  name: queueName
}]

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource table 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [for tableName in tableNames: {
  parent: tableService
  name: tableName
}]

// Blob: the host's leases and timer state, and the deployment package it downloads.
resource blobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principal in dataPrincipals: if (!empty(deploymentContainerName)) {
  name: guid(storage.id, principal.id, storageBlobDataOwnerRoleId)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwnerRoleId)
    principalId: principal.id
    principalType: principal.type
  }
}]

// Blob, the archive's container only: retention writes (Put Block, Put Block List), the API
// and ordersctl read. Scoped to the container (learn.microsoft.com/azure/storage/blobs/
// assign-azure-role-data-access, read 2026-11-25): what retention needs, whatever role the
// host holds on the account (today Blob Data Owner, above, for its package and leases).
resource archiveDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principal in dataPrincipals: if (!empty(archiveContainerName)) {
  name: guid(archiveContainer.id, principal.id, storageBlobDataContributorRoleId)
  scope: archiveContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributorRoleId)
    principalId: principal.id
    principalType: principal.type
  }
}]

// Queue: the scheduler's nudges (trigger, output binding, the supervisor's delayed sends).
resource queueDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principal in dataPrincipals: if (!empty(queueNames)) {
  name: guid(storage.id, principal.id, storageQueueDataContributorRoleId)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataContributorRoleId)
    principalId: principal.id
    principalType: principal.type
  }
}]

// Table: the state store (orders) and the rejections table, in whichever account holds them.
resource tableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principal in dataPrincipals: if (!empty(tableNames)) {
  name: guid(storage.id, principal.id, storageTableDataContributorRoleId)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributorRoleId)
    principalId: principal.id
    principalType: principal.type
  }
}]

output name string = storage.name
output blobEndpoint string = storage.properties.primaryEndpoints.blob
