// Log Analytics + workspace-based Application Insights. Local (instrumentation key)
// authentication is disabled: only Entra ID tokens may ingest telemetry, so the app's
// identity gets Monitoring Metrics Publisher on the component, and the app sends
// APPLICATIONINSIGHTS_AUTHENTICATION_STRING with that identity's client id. The same
// identity reads the workspace (Log Analytics Reader): the operator page queries one
// order's spans there (adapters/traces.py), by the workspace id this module outputs.

param logAnalyticsName string
param applicationInsightsName string
param location string = resourceGroup().location
param tags object = {}

@description('Principal (the app identity) allowed to send telemetry.')
param metricsPublisherPrincipalId string

@description('Principal (the app identity) allowed to query the workspace: the operator page reads an order\'s spans there.')
param logsReaderPrincipalId string

// Built-in role definition id (Azure built-in roles, Monitor category).
var monitoringMetricsPublisherRoleId = '3913510d-42f4-4e42-8a64-420c390055eb' // Monitoring Metrics Publisher
var logAnalyticsReaderRoleId = '73c42c96-874c-492b-b04d-ab87d138a893' // Log Analytics Reader

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

resource logsReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(logAnalytics.id, logsReaderPrincipalId, logAnalyticsReaderRoleId)
  scope: logAnalytics
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', logAnalyticsReaderRoleId)
    principalId: logsReaderPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output applicationInsightsName string = applicationInsights.name
output logAnalyticsName string = logAnalytics.name
// The workspace id (a GUID, "Workspace ID" in the portal) that queries name: app setting
// APPLICATIONINSIGHTS_WORKSPACE_ID.
output logAnalyticsWorkspaceId string = logAnalytics.properties.customerId
