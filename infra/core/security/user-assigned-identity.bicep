// The app's only credential: a user-assigned managed identity. The function app runs
// as it, and every connection (storage, Service Bus, Application Insights) names its
// client id. Its roles are granted next to each resource, in that resource's module.

param name string
param location string = resourceGroup().location
param tags object = {}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

output name string = identity.name
output resourceId string = identity.id
output principalId string = identity.properties.principalId
output clientId string = identity.properties.clientId
