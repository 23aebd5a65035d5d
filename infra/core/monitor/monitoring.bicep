// Log Analytics + workspace-based Application Insights. Local (instrumentation key)
// authentication is disabled: only Entra ID tokens may ingest telemetry, so the app's
// identity gets Monitoring Metrics Publisher on the component, and the app sends
// APPLICATIONINSIGHTS_AUTHENTICATION_STRING with that identity's client id.

param logAnalyticsName string
param applicationInsightsName string
param location string = resourceGroup().location
param tags object = {}

@description('Principal (the app identity) allowed to send telemetry.')
param metricsPublisherPrincipalId string

// Built-in role definition id (Azure built-in roles, Monitor category).
var monitoringMetricsPublisherRoleId = '3913510d-42f4-4e42-8a64-420c390055eb' // Monitoring Metrics Publisher

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    retentionInDays: 30
    sku: {
      name: 'PerGB2018'
    }
  }
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: applicationInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
    DisableLocalAuth: true
  }
}

resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, metricsPublisherPrincipalId, monitoringMetricsPublisherRoleId)
  scope: applicationInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisherRoleId)
    principalId: metricsPublisherPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output applicationInsightsName string = applicationInsights.name
output logAnalyticsName string = logAnalytics.name
