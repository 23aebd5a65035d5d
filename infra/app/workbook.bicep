// A shared workbook on the Application Insights component: the orders over time from the
// app's own metrics (customMetrics; names in core/names.py, explained in
// docs/observability.md). Open it from the component's Workbooks blade. One order's trace
// (every hop, attempt and host) is in Transaction search, by its order.id.

param location string = resourceGroup().location
param tags object = {}

@description('Application Insights component the app sends its metrics to.')
param applicationInsightsName string

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

// Counters arrive as customMetrics rows, one per export interval: valueSum is the count in
// that interval, customDimensions the attributes.
var ordersByState = '''
customMetrics
| where name in ("orders.submitted", "orders.closed")
| extend state = iff(name == "orders.submitted", strcat("submitted: ", tostring(customDimensions["order.outcome"])), tostring(customDimensions["order.state"]))
| summarize orders = sum(valueSum) by state, bin(timestamp, 5m)
'''

var deadlineMissesByStep = '''
customMetrics
| where name == "steps.deadline_misses"
| extend step = strcat(tostring(customDimensions["order.step"]), " (", tostring(customDimensions["order.kind"]), ")")
| summarize misses = sum(valueSum) by step, bin(timestamp, 5m)
'''

var compensationsByStep = '''
customMetrics
| where name == "compensations"
| extend undo = strcat(tostring(customDimensions["order.step"]), ": ", tostring(customDimensions["order.outcome"]))
| summarize compensations = sum(valueSum) by undo, bin(timestamp, 5m)
'''

var stepDuration = '''
customMetrics
| where name == "steps.duration"
| extend step = strcat(tostring(customDimensions["order.step"]), " (", tostring(customDimensions["order.kind"]), ")")
| summarize seconds = sum(valueSum) / sum(valueCount) by step, bin(timestamp, 5m)
'''

var perStep = '''
customMetrics
| where name in ("steps.claimed", "steps.retries", "steps.deadline_misses")
| extend step = strcat(tostring(customDimensions["order.step"]), " (", tostring(customDimensions["order.kind"]), ")")
| summarize attempts = sumif(valueSum, name == "steps.claimed"), retries = sumif(valueSum, name == "steps.retries"), misses = sumif(valueSum, name == "steps.deadline_misses") by step
| extend missPercent = round(100.0 * misses / attempts, 1)
| order by step asc
'''

var operationsPerOrder = '''
let orders = toscalar(customMetrics | where name == "orders.closed" | summarize sum(valueSum));
customMetrics
| where name in ("table.operations", "messages.sent")
| summarize total = sum(valueSum) by name, operation = tostring(customDimensions["operation"])
| extend perOrder = round(total / orders, 2)
| order by name asc, operation asc
'''

var breaker = '''
customMetrics
| where name == "breaker.state_changes"
| extend change = strcat(tostring(customDimensions["remote.service"]), " -> ", tostring(customDimensions["breaker.state"]))
| summarize changes = sum(valueSum) by change, bin(timestamp, 5m)
'''

var remoteRetries = '''
customMetrics
| where name == "remote.retries"
| extend call = strcat(tostring(customDimensions["remote.service"]), " ", tostring(customDimensions["remote.action"]))
| summarize retries = sum(valueSum) by call, bin(timestamp, 5m)
'''

// Internal messages (nudges, agent requests and responses) dropped because they cannot be
// acted on: malformed, untrusted (claims no copy of the app sends) or forged
// (docs/failure-handling.md). Any at all deserves a look: the app itself sends none.
var droppedMessages = '''
customMetrics
| where name == "messages.dropped"
| extend what = strcat(tostring(customDimensions["operation"]), " ", tostring(customDimensions["drop.reason"]))
| summarize dropped = sum(valueSum) by what, bin(timestamp, 5m)
'''

// The charts, in the order they are shown.
var charts = [
  {
    name: 'orders-by-state'
    title: 'Orders: submitted, and ended per final state'
    query: ordersByState
    visualization: 'timechart'
  }
  {
    name: 'deadline-misses'
    title: 'Deadline misses per step (complete-by passed: the supervisor reset the step or gave up)'
    query: deadlineMissesByStep
    visualization: 'timechart'
  }
  {
    name: 'compensations'
    title: 'Compensations per step, by outcome'
    query: compensationsByStep
    visualization: 'timechart'
  }
  {
    name: 'step-duration'
    title: 'Step duration, claim to response (mean seconds)'
    query: stepDuration
    visualization: 'timechart'
  }
  {
    name: 'per-step'
    title: 'Attempts, retries and deadline misses per step'
    query: perStep
    visualization: 'table'
  }
  {
    name: 'operations'
    title: 'Table and Service Bus operations per order'
    query: operationsPerOrder
    visualization: 'table'
  }
  {
    name: 'breaker'
    title: 'Circuit breaker state changes'
    query: breaker
    visualization: 'timechart'
  }
  {
    name: 'remote-retries'
    title: 'Calls to the remote services after a request\'s first'
    query: remoteRetries
    visualization: 'timechart'
  }
  {
    name: 'dropped-messages'
    title: 'Internal messages dropped (malformed, untrusted or forged)'
    query: droppedMessages
    visualization: 'timechart'
  }
]

var workbook = {
  version: 'Notebook/1.0'
  items: concat([
    {
      type: 1
      name: 'about'
      content: {
        json: '## Orders\nFrom the app\'s metrics over the last 24 hours (docs/observability.md). One order\'s path: Transaction search, `order.id`.'
      }
    }
  ], map(charts, chart => {
    type: 3
    name: chart.name
    content: {
      version: 'KqlItem/1.0'
      title: chart.title
      query: chart.query
      size: 0
      queryType: 0
      resourceType: 'microsoft.insights/components'
      visualization: chart.visualization
      timeContext: {
        durationMs: 86400000
      }
    }
  }))
  fallbackResourceIds: [
    applicationInsights.id
  ]
  '$schema': 'https://github.com/Microsoft/Application-Insights-Workbooks/blob/master/schema/workbook.json'
}

resource orders 'Microsoft.Insights/workbooks@2023-06-01' = {
  // A workbook's name must be a GUID.
  name: guid(applicationInsights.id, 'orders-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: 'Orders: states, deadline misses, compensations'
    category: 'workbook'
    sourceId: applicationInsights.id
    serializedData: string(workbook)
    version: '1.0'
  }
}

output workbookId string = orders.id
