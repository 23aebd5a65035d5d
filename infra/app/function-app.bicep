// The function app on the Flex Consumption plan (FC1): Linux, Python 3.13, running as
// the user-assigned identity. The deployment package sits in a blob container the
// platform reads with that identity, and every connection the host and the app open
// is identity-based: app settings carry names and a client id, never a key.

param name string
param planName string
param location string = resourceGroup().location
param tags object = {}

@description('azd service name (azure.yaml) this app is deployed as.')
param serviceName string

@description('Resource id of the user-assigned identity the app runs as.')
param identityId string

@description('Client id of that identity (named by the identity-based connection settings).')
param identityClientId string

param storageAccountName string
param deploymentContainerName string
param applicationInsightsName string

@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@allowed([
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('The app\'s own settings (adapters/settings.py), merged over the host settings below.')
param appSettings object

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true // Linux
  }
}

resource app 'Microsoft.Web/sites@2024-04-01' = {
  name: name
  location: location
  tags: union(tags, {
    'azd-service-name': serviceName
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    siteConfig: {
      minTlsVersion: '1.2'
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      // Python 3.13 is GA on Flex Consumption (Microsoft Learn, "Supported languages in Azure Functions",
      // read 2026-11-29). From 3.13 the Python runtime is the azure-functions-runtime package, pinned in
      // requirements.txt ("Changes and guidance for Python 3.13+ in Azure Functions": pinning is
      // recommended for production); it is what runs the functions locally too (tools/funchost).
      runtime: {
        name: 'python'
        version: '3.13'
      }
    }
  }

  // Flex Consumption takes the runtime from functionAppConfig above:
  // FUNCTIONS_WORKER_RUNTIME and FUNCTIONS_EXTENSION_VERSION are not set (not allowed).
  resource settings 'config' = {
    name: 'appsettings'
    properties: union(appSettings, {
      // AzureWebJobsStorage, identity-based: the host's storage and the app's tables
      // and scheduler queue (adapters/clients.py builds the endpoints from the name).
      AzureWebJobsStorage__accountName: storage.name
      AzureWebJobsStorage__credential: 'managedidentity'
      AzureWebJobsStorage__clientId: identityClientId
      // Telemetry: the connection string locates the component (its instrumentation
      // key is an identifier, not a credential: local auth is disabled on the
      // component), and ingestion is authorized with the identity's Entra token.
      APPLICATIONINSIGHTS_CONNECTION_STRING: applicationInsights.properties.ConnectionString
      APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
      // DefaultAzureCredential in any library code picks this identity too.
      AZURE_CLIENT_ID: identityClientId
    })
  }
}

output name string = app.name
output defaultHostName string = app.properties.defaultHostName
